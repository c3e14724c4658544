"""``get_all_torch_devices()`` lists the NPU(s) instead of ``[]``.

Upstream enumerates CUDA devices when is_nvidia() is True and nothing for an
NPU, so ``unload_all_models`` frees nothing. Versions whose function has an
NPU branch of its own need only ``is_nvidia`` fixed and are left alone.
is_nvidia stays False on the NPU, which keeps the CUDA-only aimdo/DynamicVRAM
path off.
"""

from ascend_shim.patching import Patch
from ascend_shim.patches._guards import handles_npu, npu_and_attribute, npu_devices

_npu_and_function = npu_and_attribute("get_all_torch_devices")


def guard(mm):
    reason = _npu_and_function(mm)
    if reason:
        return reason
    if handles_npu(mm.get_all_torch_devices):
        return "get_all_torch_devices has an NPU branch (is_nvidia is enough)"
    return None


def _npu_devices(wrapped, instance, args, kwargs):
    devices = npu_devices()
    return devices if devices else wrapped(*args, **kwargs)


def apply(changes, mm):
    changes.wrap(mm, "get_all_torch_devices", _npu_devices)


PATCH = Patch(
    name="device_list",
    target="comfy.model_management",
    summary="get_all_torch_devices() returns the NPU devices",
    guard=guard,
    apply=apply,
)
