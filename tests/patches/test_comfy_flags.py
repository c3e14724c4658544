"""ComfyUI's own flags and every argument win over the shim, on real ComfyUI releases.

A patch changes behaviour only where ComfyUI's *chosen* device is the NPU.
Each case runs a real ComfyUI release (main.py's order, the flags after it)
on the simulated Ascend box twice, with and without the shim. Under a flag that moves ComfyUI off
the NPU, nothing differs. Under a precision flag, every answer the flag
decides is upstream's; the shim only answers where upstream would have
crashed into the missing NVIDIA driver.
"""

import pytest

import harness
from ascend_shim.patches import PATCHES
from comfy_runs import NEWEST, NO_DRIVER, NPU_BRANCH_OF_DEVICE_LIST, comfy_run, ok, variant_without  # noqa: F401

# the newest release whose should_use_bf16 has no NPU arm (the shim answers there) and the
# newest of all: the two states the precision flags meet; the --cpu flag also meets the oldest
BEFORE_BF16_NPU = harness.comfyui_versions_with("ascend", without=("bf16_npu",))[-1]
PRECISION_VERSIONS = (BEFORE_BF16_NPU, NEWEST)
CPU_FLAG_VERSIONS = (harness.COMFYUI_VERSIONS[0],) + PRECISION_VERSIONS
PRECISION_FLAGS = ((), ("--force-fp32",), ("--force-fp16",), ("--bf16-unet",), ("--fp16-unet",),
                   ("--fp32-unet",))
PRECISION_PROBES = ("should_use_bf16", "should_use_bf16_on_cpu", "should_use_fp16", "unet_dtype",
                    "unet_dtype_bf16_or_fp32")


def without(probes, name):
    return {k: v for k, v in probes.items() if k != name}


def comfyui_patches(status):
    """Status rows of the patches that change ComfyUI's own modules."""
    return {name: row for name, row in status.items()
            if name not in NOT_COMFYUI and not name.startswith("kitchen")}


# what patches torch_npu (kernels on NPU tensors, which a --cpu run never hands them) or the
# environment, not ComfyUI's own modules
NOT_COMFYUI = {patch.name for patch in PATCHES if patch.target == "torch_npu"} | {"alloc_conf"}


@pytest.mark.parametrize("version", CPU_FLAG_VERSIONS)
def test_cpu_flag_leaves_comfyui_as_upstream_runs_it(comfy_run, version):
    """--cpu on the Ascend box: is_ascend_npu() is still True, but ComfyUI computes on the CPU."""
    result = comfy_run(version, flags=("--cpu",))
    baseline = comfy_run(version, flags=("--cpu",), ASCEND_SHIM="0")
    assert baseline["probes"]["is_ascend_npu"] == ok(True)
    # int8_layer puts its layer on the NPU itself: kitchen serves it by the tensors' device
    assert without(result["probes"], "int8_layer") == without(baseline["probes"], "int8_layer")
    assert result["constants"] == baseline["constants"]  # DISABLE_MMAP included
    assert all(result["originals"].values()), result["originals"]
    for name, row in comfyui_patches(result["status"]).items():
        assert row["state"] != "applied", (name, row)
    for name in ("is_nvidia", "compute_probes", "import_constants", "mmap"):
        assert result["status"][name]["reason"].startswith("ComfyUI runs on cpu"), name


@pytest.mark.parametrize("flags", PRECISION_FLAGS, ids=lambda f: " ".join(f) or "no-flag")
@pytest.mark.parametrize("version", PRECISION_VERSIONS)
def test_precision_flags_decide_before_the_shim(comfy_run, version, flags):
    result = comfy_run(version, flags=flags)["probes"]
    baseline = comfy_run(version, flags=flags, ASCEND_SHIM="0")["probes"]
    for probe in PRECISION_PROBES:
        if baseline[probe].startswith("ok:"):
            assert result[probe] == baseline[probe], (probe, result[probe], baseline[probe])
        else:  # upstream crashed into CUDA: the shim answers for the NPU
            assert baseline[probe].startswith(NO_DRIVER), (probe, baseline[probe])
            assert result[probe].startswith("ok:"), (probe, result[probe])


def test_force_fp32_keeps_bf16_off_before_v0_3_15(comfy_run):
    """A release without should_use_bf16's NPU branch: bf16 is the shim's answer, unless forced off."""
    plain = comfy_run(BEFORE_BF16_NPU)
    assert plain["probes"]["should_use_bf16"] == ok(True)
    assert plain["status"]["bf16_legacy"]["state"] == "applied"
    assert comfy_run(BEFORE_BF16_NPU, ASCEND_SHIM="0")["probes"]["should_use_bf16"] \
        .startswith(NO_DRIVER)
    forced = comfy_run(BEFORE_BF16_NPU, flags=("--force-fp32",))["probes"]
    assert forced["should_use_bf16"] == ok(False)
    assert forced["unet_dtype_bf16_or_fp32"] == ok("torch.float32")


@pytest.mark.parametrize("version", harness.comfyui_versions_with("disable_mmap")[::-2])  # newest, every 2nd
def test_disable_mmap_flag_is_the_users(comfy_run, version):
    result = comfy_run(version, flags=("--disable-mmap",))
    assert result["constants"]["DISABLE_MMAP"] is True
    assert result["status"]["mmap"]["reason"] == "mmap already off (--disable-mmap)"


@pytest.fixture(scope="module")
def device_list_variant(tmp_path_factory):
    """The newest release with get_all_torch_devices' NPU arm cut (what device_list is for)."""
    version = harness.comfyui_versions_with("device_list")[-1]
    return variant_without(tmp_path_factory, version, NPU_BRANCH_OF_DEVICE_LIST)


def test_device_list_keeps_its_arguments(comfy_run, device_list_variant):
    result = comfy_run(device_list_variant)
    baseline = comfy_run(device_list_variant, ASCEND_SHIM="0")
    probes = result["probes"]
    assert result["status"]["device_list"]["state"] == "applied"
    assert probes["get_all_torch_devices"] == ok(["npu:0"])
    assert probes["get_all_torch_devices_excluding_current"] == ok([])  # the one NPU is current
    assert baseline["probes"]["get_all_torch_devices_unknown_argument"].startswith("error: TypeError")
    assert probes["get_all_torch_devices_unknown_argument"] == \
        baseline["probes"]["get_all_torch_devices_unknown_argument"]


def test_device_list_follows_two_npus(comfy_run, device_list_variant):
    result = comfy_run(device_list_variant, TESTBED_NPU_COUNT="2")["probes"]
    assert result["get_all_torch_devices"] == ok(["npu:0", "npu:1"])
    assert result["get_all_torch_devices_excluding_current"] == ok(["npu:1"])


def test_device_list_under_cpu_flag_is_upstreams(comfy_run, device_list_variant):
    result = comfy_run(device_list_variant, flags=("--cpu",))
    baseline = comfy_run(device_list_variant, flags=("--cpu",), ASCEND_SHIM="0")
    assert baseline["probes"]["get_all_torch_devices"] == ok(["cpu"])
    assert without(result["probes"], "int8_layer") == without(baseline["probes"], "int8_layer")
    assert result["status"]["device_list"]["state"] == "skipped"
