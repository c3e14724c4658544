"""The ComfyUI patches, at the process boundary, on the simulated Ascend machine.

Each run starts ComfyUI the way main.py does (fake shapes under
tests/testbed/comfy_fakes, or a real checkout from COMFYUI_DIR) in a fresh
interpreter of a venv with the shim wheel installed, then probes every
symptom of the user's report. Each symptom is shown broken without the shim
and fixed with it; on NVIDIA and CPU machines nothing is touched.
"""

import os

import pytest

from comfy_runs import NO_DRIVER, NPU_BRANCH_OF_DEVICE_LIST, comfy_run, ok, variant_without  # noqa: F401

SHAPES = ("v0_29", "v0_3_45")


@pytest.mark.parametrize("shape", SHAPES)
def test_symptoms_reproduce_without_the_shim(comfy_run, shape):
    result = comfy_run(shape, ASCEND_SHIM="0")
    probes = result["probes"]
    assert probes["is_nvidia"] == ok(True) and probes["is_ascend_npu"] == ok(True)
    assert probes["pick_operations"].startswith(NO_DRIVER)
    assert probes["unet_dtype_fp8"].startswith(NO_DRIVER)
    assert probes["pin_memory"].startswith(NO_DRIVER)
    assert probes["debug_memory_summary"].startswith("error: KeyError")
    assert probes["load_torch_file"] == ok("follows the file")
    assert probes["synchronize"] == ok(0)
    assert result["constants"]["MAX_PINNED_MEMORY"] > 0
    assert "cudart" in result["cuda_raised"] and "get_device_properties" in result["cuda_raised"]
    if shape == "v0_29":
        assert probes["get_all_torch_devices"] == ok([])
        assert probes["int8_layer"] == ok({"device": "npu:0", "fallbacks": ["aten::_int_mm"],
                                           "quant_matmul": 0})
    assert result["status"] is None


@pytest.mark.parametrize("shape", SHAPES)
def test_symptoms_gone_with_the_shim(comfy_run, shape):
    result = comfy_run(shape)
    probes = result["probes"]
    assert probes["is_nvidia"] == ok(False)
    assert probes["pick_operations"].startswith("ok:")
    assert probes["unet_dtype_fp8"].startswith("ok:")
    assert probes["supports_fp8_compute"] == ok(False)
    assert probes["pin_memory"] == ok(False)
    assert probes["debug_memory_summary"] == ok("str")
    assert probes["load_torch_file"] == ok("independent of the file")
    assert probes["synchronize"] == ok(1)
    assert probes["should_use_bf16"] == ok(True)
    assert result["cuda_raised"] == []  # torch.cuda never reached a driver call
    constants = result["constants"]
    assert constants["MAX_PINNED_MEMORY"] == -1 and constants["NUM_STREAMS"] == 0
    assert constants["MIN_WEIGHT_MEMORY_RATIO"] == 0.4 and constants["DISABLE_MMAP"] is True
    assert result["env"]["PYTORCH_NPU_ALLOC_CONF"] == "expandable_segments:True"
    announce = [line for line in result["log"] if line.startswith("ascend_shim INFO ascend_shim active on")]
    assert len(announce) == 1 and "Ascend910B3 x1" in announce[0] and "is_nvidia" in announce[0]
    status = result["status"]
    for name in ("is_nvidia", "compute_probes", "import_constants", "synchronize", "memory_summary",
                 "mmap", "alloc_conf", "announce"):
        assert status[name]["state"] == "applied", (name, status[name])
    assert status["bf16_legacy"]["state"] == "skipped"  # both shapes have the NPU branch
    if shape == "v0_29":
        assert probes["supports_nvfp4_compute"] == ok(False)
        assert probes["supports_mxfp8_compute"] == ok(False)
        assert probes["get_all_torch_devices"] == ok(["npu:0"])
        assert probes["supports_int8_compute"] == ok(True)
        assert probes["int8_layer"] == ok({"device": "npu:0", "fallbacks": [], "quant_matmul": 1})
        assert status["kitchen_int8"]["state"] == "applied"
        assert status["kitchen_priority"]["state"] == "applied"
    else:
        assert status["device_list"]["reason"] == "this ComfyUI has no get_all_torch_devices"
        assert status["int8_compute"]["state"] == "skipped"


# ASCEND_SHIM_DISABLE value -> (probe, what the probe shows once the symptom is back).
# is_nvidia=False alone already keeps the probes and the OOM summary off torch.cuda,
# so those symptoms return only with both patches off.
SYMPTOM_OF = {
    "is_nvidia": ("is_nvidia", ok(True)),
    "is_nvidia,compute_probes": ("pick_operations", NO_DRIVER),
    "is_nvidia,memory_summary": ("debug_memory_summary", "error: KeyError"),
    "import_constants": ("pin_memory", NO_DRIVER),
    "is_nvidia,device_list": ("get_all_torch_devices", ok([])),
    "mmap": ("load_torch_file", ok("follows the file")),
    "synchronize": ("synchronize", ok(0)),
}


@pytest.mark.parametrize("disable", sorted(SYMPTOM_OF))
def test_disabling_patches_brings_their_symptom_back(comfy_run, disable):
    result = comfy_run("v0_29", ASCEND_SHIM_DISABLE=disable)
    probe, symptom = SYMPTOM_OF[disable]
    assert result["probes"][probe].startswith(symptom)
    names = set(disable.split(","))
    for name in names:
        assert result["status"][name]["state"] == "disabled"
    for other, (other_probe, other_symptom) in SYMPTOM_OF.items():
        if not names & set(other.split(",")):  # untouched patches keep their fix
            assert not result["probes"][other_probe].startswith(other_symptom), other


@pytest.mark.parametrize("disable", ["compute_probes", "memory_summary", "is_nvidia"])
def test_one_guard_alone_still_keeps_cuda_away(comfy_run, disable):
    result = comfy_run("v0_29", ASCEND_SHIM_DISABLE=disable)
    assert result["probes"]["pick_operations"].startswith("ok:")
    assert result["probes"]["debug_memory_summary"].startswith("ok:")
    assert result["cuda_raised"] == []


def test_user_flags_keep_their_meaning(comfy_run):
    with_shim = comfy_run("v0_29", flags=("--disable-mmap", "--async-offload", "--cuda-malloc"))
    without = comfy_run("v0_29", flags=("--disable-mmap", "--async-offload", "--cuda-malloc"),
                        ASCEND_SHIM="0")
    assert with_shim["constants"]["DISABLE_MMAP"] is True
    assert "mmap already off (--disable-mmap)" in with_shim["status"]["mmap"]["reason"]
    assert with_shim["constants"]["NUM_STREAMS"] == without["constants"]["NUM_STREAMS"] == 2
    assert "NUM_STREAMS kept (--async-offload)" in with_shim["status"]["import_constants"]["reason"]
    assert with_shim["env"]["PYTORCH_CUDA_ALLOC_CONF"] == without["env"]["PYTORCH_CUDA_ALLOC_CONF"]
    disabled = comfy_run("v0_29", flags=("--disable-cuda-malloc",))
    assert disabled["env"]["PYTORCH_CUDA_ALLOC_CONF"] is None


def test_mmap_opt_out(comfy_run):
    result = comfy_run("v0_29", ASCEND_SHIM_MMAP="keep")
    assert result["probes"]["load_torch_file"] == ok("follows the file")
    assert result["status"]["mmap"] == {"state": "skipped", "reason": "kept by ASCEND_SHIM_MMAP=keep",
                                        "late": False}


def test_user_allocator_setting_wins(comfy_run):
    result = comfy_run("v0_29", PYTORCH_NPU_ALLOC_CONF="max_split_size_mb:256")
    assert result["env"]["PYTORCH_NPU_ALLOC_CONF"] == "max_split_size_mb:256"
    assert result["status"]["alloc_conf"]["state"] == "skipped"


def test_int8_compute_follows_the_backend(comfy_run):
    result = comfy_run("v0_29", ASCEND_SHIM_INT8="off")
    assert result["probes"]["supports_int8_compute"] == ok(False)  # ComfyUI dequantizes instead
    assert result["status"]["kitchen_int8"]["reason"] == "ASCEND_SHIM_INT8=off"


def test_vendor_setup_cpu_torch_with_torch_npu(comfy_run):
    result = comfy_run("v0_29", machine="ascend-cpu")
    assert result["probes"]["pick_operations"].startswith("ok:")
    assert result["probes"]["int8_layer"] == ok({"device": "npu:0", "fallbacks": [], "quant_matmul": 1})
    assert result["status"]["is_nvidia"]["state"] == "applied"


@pytest.mark.parametrize("machine,flags", [("nvidia", ()), ("cpu", ("--cpu",))])
@pytest.mark.parametrize("shape", SHAPES)
def test_nothing_changes_on_nvidia_or_cpu(comfy_run, machine, flags, shape):
    result = comfy_run(shape, machine=machine, flags=flags)
    baseline = comfy_run(shape, machine=machine, flags=flags, ASCEND_SHIM="0")
    assert all(result["originals"].values()), result["originals"]
    assert result["probes"] == baseline["probes"]
    assert result["constants"] == baseline["constants"]
    assert result["env"] == baseline["env"]
    # no torch_npu here: the shim left the import path at ComfyUI's first import,
    # so its engine never even started (issue 19 item 3)
    assert result["status"] is None
    assert not [line for line in result["log"] if line.startswith("ascend_shim")]


def test_comfyui_before_ascend_support_is_left_alone(comfy_run):
    # ascend-cpu: an NPU the shim would act on (on the cpu machine it leaves before deciding)
    result = comfy_run("v0_3_10", machine="ascend-cpu", flags=("--cpu",))
    status = result["status"]
    for name in ("is_nvidia", "compute_probes", "import_constants", "announce"):
        assert status[name]["reason"] == "this ComfyUI predates Ascend support (needs v0.3.11+)"
    assert all(result["originals"].values())


@pytest.mark.skipif(not os.environ.get("COMFYUI_DIR"), reason="COMFYUI_DIR is not set: no real ComfyUI to check")
def test_real_comfyui(comfy_run):
    """The same symptoms against a real ComfyUI checkout (its comfy/ modules, no main.py needed).

    Functions that version does not have yet are reported as AttributeError
    by the probe and not asserted.
    """
    comfy_dir = os.path.abspath(os.environ["COMFYUI_DIR"])
    broken = comfy_run(comfy_dir, ASCEND_SHIM="0")
    result = comfy_run(comfy_dir)
    probes = result["probes"]

    def present(name):
        return not probes[name].startswith("error: AttributeError")

    assert broken["probes"]["is_nvidia"] == ok(True) and probes["is_nvidia"] == ok(False)
    assert broken["probes"]["pick_operations"].startswith(NO_DRIVER)
    assert probes["pick_operations"].startswith("ok:")
    assert probes["unet_dtype_fp8"].startswith("ok:") and probes["supports_fp8_compute"] == ok(False)
    assert broken["probes"]["load_torch_file"] == ok("follows the file")
    assert probes["load_torch_file"] == ok("independent of the file")
    assert result["cuda_raised"] == []
    if present("pin_memory"):
        assert probes["pin_memory"] == ok(False)
    if present("debug_memory_summary"):
        assert probes["debug_memory_summary"].startswith("ok:")
    if present("get_all_torch_devices"):
        assert probes["get_all_torch_devices"] == ok(["npu:0"])
    assert result["status"]["is_nvidia"]["state"] == "applied"
    assert result["status"]["mmap"]["state"] == "applied"
    assert result["status"]["is_nvidia"]["late"] is False


def test_device_list_without_an_npu_branch(comfy_run, tmp_path_factory):
    """A ComfyUI whose get_all_torch_devices knows only CUDA: the patch lists the NPU."""
    variant = variant_without(tmp_path_factory, "v0_29", NPU_BRANCH_OF_DEVICE_LIST)
    assert comfy_run(variant, ASCEND_SHIM="0")["probes"]["get_all_torch_devices"] == ok([])
    result = comfy_run(variant)
    assert result["probes"]["get_all_torch_devices"] == ok(["npu:0"])
    assert result["status"]["device_list"]["state"] == "applied"
    assert comfy_run("v0_29")["status"]["device_list"]["reason"] == \
        "get_all_torch_devices has an NPU branch (is_nvidia is enough)"


def test_bf16_before_the_npu_branch(comfy_run, tmp_path_factory):
    """ComfyUI before v0.3.15: should_use_bf16 falls through to CUDA on the NPU."""
    variant = variant_without(tmp_path_factory, "v0_3_45",
                              "    if is_ascend_npu():\n        return True\n    props = ", keep="    props = ")
    broken = comfy_run(variant, ASCEND_SHIM="0")["probes"]["should_use_bf16"]
    assert broken.startswith(NO_DRIVER)
    result = comfy_run(variant)
    assert result["probes"]["should_use_bf16"] == ok(True)
    assert result["status"]["bf16_legacy"]["state"] == "applied"
