"""The ComfyUI patches, at the process boundary, on the simulated Ascend machine.

Each run starts a real ComfyUI release (harness.comfyui_dir) the way main.py
does in a fresh interpreter of a venv with the shim wheel installed, then
probes every symptom of the user's report. Each symptom is shown broken
without the shim and fixed with it, at every release the suite unpacks; which
symptom a release can show is read from its source (harness.comfyui_features),
as the shim's own guards decide. On NVIDIA and CPU machines nothing is touched.
"""

import pytest

import harness
from comfy_runs import NEWEST, NO_DRIVER, NPU_BRANCH_OF_DEVICE_LIST, comfy_run, ok, variant_without  # noqa: F401

ASCEND = harness.comfyui_versions_with("ascend")
# one release per distinct feature set: where a slow matrix tells something new
REPRESENTATIVES = harness.comfyui_representatives(ASCEND)
BEFORE_ASCEND = str(harness.COMFY_FAKES / "before_ascend_support")


def has(version, feature):
    return feature in harness.comfyui_features(version)


@pytest.mark.parametrize("version", ASCEND)
def test_symptoms_reproduce_without_the_shim(comfy_run, version):
    result = comfy_run(version, ASCEND_SHIM="0")
    probes = result["probes"]
    assert probes["is_nvidia"] == ok(True) and probes["is_ascend_npu"] == ok(True)
    assert probes["pick_operations"].startswith(NO_DRIVER)
    assert probes["unet_dtype_fp8"].startswith(NO_DRIVER)
    assert probes["supports_fp8_compute"].startswith(NO_DRIVER)
    assert probes["load_torch_file"] == ok("follows the file")
    assert "get_device_properties" in result["cuda_raised"]
    if not has(version, "bf16_npu"):
        assert probes["should_use_bf16"].startswith(NO_DRIVER)
    if has(version, "disable_mmap"):
        assert result["constants"]["DISABLE_MMAP"] is False
    if has(version, "memory_summary"):
        assert probes["debug_memory_summary"].startswith("error: KeyError")
        assert probes["pin_memory"].startswith(NO_DRIVER)
        assert result["constants"]["MAX_PINNED_MEMORY"] > 0
        assert "cudart" in result["cuda_raised"]
    if has(version, "synchronize"):
        assert probes["synchronize"] == ok(0)
    if has(version, "device_list"):
        assert probes["get_all_torch_devices"] == ok([])
    if has(version, "int8"):
        assert probes["int8_layer"].startswith("ok: {'device': 'npu:0', 'fallbacks': ['aten::_int_mm']")
        assert probes["int8_layer"].endswith("'dynamic_quant': 0}")
    assert result["status"] is None


@pytest.mark.parametrize("version", ASCEND)
def test_symptoms_gone_with_the_shim(comfy_run, version):
    result = comfy_run(version)
    baseline = comfy_run(version, ASCEND_SHIM="0")
    probes = result["probes"]
    assert probes["is_nvidia"] == ok(False)
    assert probes["pick_operations"].startswith("ok:")
    assert probes["unet_dtype_fp8"].startswith("ok:")
    assert probes["supports_fp8_compute"] == ok(False)
    assert probes["load_torch_file"] == ok("independent of the file")
    assert probes["should_use_bf16"] == ok(True)
    assert result["cuda_raised"] == []  # torch.cuda never reached a driver call
    constants = result["constants"]
    assert constants["MIN_WEIGHT_MEMORY_RATIO"] == 0.4
    streams = baseline["constants"]["NUM_STREAMS"]
    assert constants["NUM_STREAMS"] == (0 if streams not in ("absent", 0, 1) else streams)
    assert result["env"]["PYTORCH_NPU_ALLOC_CONF"] == "expandable_segments:True"
    announce = [line for line in result["log"] if line.startswith("ascend_shim INFO ascend_shim active on")]
    assert len(announce) == 1 and "Ascend910B3 x1" in announce[0] and "is_nvidia" in announce[0]
    status = result["status"]
    for name in ("is_nvidia", "compute_probes", "import_constants", "mmap", "alloc_conf", "announce"):
        assert status[name]["state"] == "applied", (name, status[name])
    if has(version, "disable_mmap"):
        assert constants["DISABLE_MMAP"] is True
    if has(version, "pin_memory"):
        assert probes["pin_memory"] == ok(False) and constants["MAX_PINNED_MEMORY"] == -1
    if has(version, "memory_summary"):
        assert probes["debug_memory_summary"] == ok("str")
        assert status["memory_summary"]["state"] == "applied"
    if has(version, "synchronize"):
        assert probes["synchronize"] == ok(1)
        assert status["synchronize"]["state"] == "applied"
    if has(version, "bf16_npu"):
        assert status["bf16_legacy"]["state"] == "skipped"
    else:
        assert status["bf16_legacy"]["state"] == "applied"
    if has(version, "device_list"):
        assert probes["get_all_torch_devices"] == ok(["npu:0"])  # is_nvidia alone lets its NPU arm run
        assert status["device_list"]["reason"] == "get_all_torch_devices has an NPU branch (is_nvidia is enough)"
    else:
        assert status["device_list"]["reason"] == "this ComfyUI has no get_all_torch_devices"
    if has(version, "nvfp4"):
        assert probes["supports_nvfp4_compute"] == ok(False)
    if has(version, "mxfp8"):
        assert probes["supports_mxfp8_compute"] == ok(False)
    if has(version, "int8"):
        assert probes["int8_layer"].startswith("ok: {'device': 'npu:0', 'fallbacks': [], 'dynamic_quant': ")
        assert not probes["int8_layer"].endswith("'dynamic_quant': 0}")
        assert status["kitchen_int8"]["state"] == "applied"
        assert status["kitchen_priority"]["state"] == "applied"
    if not has(version, "int8_compute"):
        assert status["int8_compute"]["reason"] == "this ComfyUI has no supports_int8_compute"


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
    result = comfy_run(NEWEST, ASCEND_SHIM_DISABLE=disable)
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
    result = comfy_run(NEWEST, ASCEND_SHIM_DISABLE=disable)
    assert result["probes"]["pick_operations"].startswith("ok:")
    assert result["probes"]["debug_memory_summary"].startswith("ok:")
    assert result["cuda_raised"] == []


def test_user_flags_keep_their_meaning(comfy_run):
    flags = ("--disable-mmap", "--async-offload", "--cuda-malloc")
    with_shim = comfy_run(NEWEST, flags=flags)
    without = comfy_run(NEWEST, flags=flags, ASCEND_SHIM="0")
    assert with_shim["constants"]["DISABLE_MMAP"] is True
    assert "mmap already off (--disable-mmap)" in with_shim["status"]["mmap"]["reason"]
    assert with_shim["constants"]["NUM_STREAMS"] == without["constants"]["NUM_STREAMS"] == 2
    assert "NUM_STREAMS kept (--async-offload)" in with_shim["status"]["import_constants"]["reason"]
    assert with_shim["env"]["PYTORCH_CUDA_ALLOC_CONF"] == without["env"]["PYTORCH_CUDA_ALLOC_CONF"]
    disabled = comfy_run(NEWEST, flags=("--disable-cuda-malloc",))
    assert disabled["env"]["PYTORCH_CUDA_ALLOC_CONF"] is None


def test_mmap_opt_out(comfy_run):
    result = comfy_run(NEWEST, ASCEND_SHIM_MMAP="keep")
    assert result["probes"]["load_torch_file"] == ok("follows the file")
    assert result["status"]["mmap"] == {"state": "skipped", "reason": "kept by ASCEND_SHIM_MMAP=keep",
                                        "late": False}


def test_user_allocator_setting_wins(comfy_run):
    result = comfy_run(NEWEST, PYTORCH_NPU_ALLOC_CONF="max_split_size_mb:256")
    assert result["env"]["PYTORCH_NPU_ALLOC_CONF"] == "max_split_size_mb:256"
    assert result["status"]["alloc_conf"]["state"] == "skipped"


@pytest.mark.parametrize("version", harness.comfyui_versions_with("int8"))
def test_int8_backend_off_leaves_the_layer_to_comfyui(comfy_run, version):
    """ASCEND_SHIM_INT8=off: no shim backend; the INT8 layer runs as upstream's kitchen has it."""
    result = comfy_run(version, ASCEND_SHIM_INT8="off")
    assert result["status"]["kitchen_int8"]["reason"] == "ASCEND_SHIM_INT8=off"
    assert result["probes"]["int8_layer"].endswith("'dynamic_quant': 0}")


def test_vendor_setup_cpu_torch_with_torch_npu(comfy_run):
    result = comfy_run(NEWEST, machine="ascend-cpu")
    assert result["probes"]["pick_operations"].startswith("ok:")
    assert result["probes"]["int8_layer"].startswith("ok: {'device': 'npu:0', 'fallbacks': [], 'dynamic_quant': ")
    assert not result["probes"]["int8_layer"].endswith("'dynamic_quant': 0}")
    assert result["status"]["is_nvidia"]["state"] == "applied"


# real ComfyUI asks torch.device(torch.cuda.current_device()): an int device needs a torch
# built with CUDA, so the simulated NVIDIA box runs in the suite whose torch is (3.13, cu130)
NVIDIA = pytest.param("nvidia", (), marks=pytest.mark.skipif(
    not harness.torch_cuda_build(), reason="the simulated NVIDIA box needs a CUDA-build torch"))


@pytest.mark.parametrize("machine,flags", [NVIDIA, ("cpu", ("--cpu",))])
@pytest.mark.parametrize("version", (REPRESENTATIVES[0], REPRESENTATIVES[-1]))
def test_nothing_changes_on_nvidia_or_cpu(comfy_run, machine, flags, version):
    result = comfy_run(version, machine=machine, flags=flags)
    baseline = comfy_run(version, machine=machine, flags=flags, ASCEND_SHIM="0")
    assert all(result["originals"].values()), result["originals"]
    assert result["probes"] == baseline["probes"]
    assert result["constants"] == baseline["constants"]
    assert result["env"] == baseline["env"]
    # no torch_npu here: the shim left the import path at ComfyUI's first import,
    # so its engine never even started (issue 19 item 3)
    assert result["status"] is None
    assert not [line for line in result["log"] if line.startswith("ascend_shim")]


def test_comfyui_before_ascend_support_is_left_alone(comfy_run):
    """Every release the suite unpacks knows the NPU; the state before ComfyUI PR #5436 is the
    one small fake the bed keeps (tests/testbed/comfy_fakes/before_ascend_support). On
    ascend-cpu: an NPU the shim would act on (on the cpu machine it leaves before deciding)."""
    result = comfy_run(BEFORE_ASCEND, machine="ascend-cpu", flags=("--cpu",), kitchen=None)
    status = result["status"]
    for name in ("is_nvidia", "compute_probes", "import_constants", "announce"):
        assert status[name]["reason"] == "this ComfyUI predates Ascend support (no is_ascend_npu in comfy.model_management)"
    assert all(result["originals"].values())


def test_device_list_without_an_npu_branch(comfy_run, tmp_path_factory):
    """A ComfyUI whose get_all_torch_devices knows only CUDA (the newest release with its NPU arm
    cut): the patch lists the NPU."""
    version = harness.comfyui_versions_with("device_list")[-1]
    variant = variant_without(tmp_path_factory, version, NPU_BRANCH_OF_DEVICE_LIST)
    assert comfy_run(variant, ASCEND_SHIM="0")["probes"]["get_all_torch_devices"] == ok([])
    result = comfy_run(variant)
    assert result["probes"]["get_all_torch_devices"] == ok(["npu:0"])
    assert result["status"]["device_list"]["state"] == "applied"
