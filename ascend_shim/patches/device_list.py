"""``get_all_torch_devices()`` lists the NPU(s) instead of ``[]``.

Upstream enumerates CUDA devices when is_nvidia() is True and nothing for an
NPU, so ``unload_all_models`` frees nothing. is_nvidia stays False on the NPU
(patch ``is_nvidia``), which keeps the CUDA-only aimdo/DynamicVRAM path off.
"""

from ascend_shim.engine import Patch
from ascend_shim.patches._guards import npu_and_attribute, npu_devices


def _npu_devices(wrapped, instance, args, kwargs):
    devices = npu_devices()
    return devices if devices else wrapped(*args, **kwargs)


def apply(changes, mm):
    changes.wrap(mm, "get_all_torch_devices", _npu_devices)


PATCH = Patch(
    name="device_list",
    target="comfy.model_management",
    summary="get_all_torch_devices() returns the NPU devices",
    guard=npu_and_attribute("get_all_torch_devices"),
    apply=apply,
)
