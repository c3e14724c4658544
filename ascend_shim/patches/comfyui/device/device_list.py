"""``get_all_torch_devices()`` lists the NPU(s) instead of ``[]``.

Upstream enumerates CUDA devices when is_nvidia() is True and nothing for an
NPU, so ``unload_all_models`` frees nothing. Versions whose function has an
NPU branch of its own need only ``is_nvidia`` fixed and are left alone.
is_nvidia stays False on the NPU, which keeps the CUDA-only aimdo/DynamicVRAM
path off. ``exclude_current`` keeps its meaning; any other argument goes to
the original, which answers it (or refuses it) as upstream does.
"""

from ascend_shim.engine import versions
from ascend_shim.engine.patching import Patch, argument
from ascend_shim.patches.shared.guards import handles_npu, npu_and_attribute, npu_chosen, npu_devices
from ascend_shim.patches.shared.wraps import wrap_function

_npu_and_function = npu_and_attribute("get_all_torch_devices")


def guard(mm):
    reason = _npu_and_function(mm)
    if reason:
        return reason
    if handles_npu(mm.get_all_torch_devices):
        return "get_all_torch_devices has an NPU branch (is_nvidia is enough)"
    return None


def _only_known_arguments(args, kwargs):
    return len(args) + len(kwargs) <= 1 and set(kwargs) <= {"exclude_current"}


def _npu_devices(mm, wrapped, instance, args, kwargs):
    if not npu_chosen(mm) or not _only_known_arguments(args, kwargs):
        return wrapped(*args, **kwargs)  # the original runs here, unchanged: what raised is in the frames below
    devices = npu_devices()
    if not devices:
        return wrapped(*args, **kwargs)  # the original runs here, unchanged: what raised is in the frames below
    if argument(args, kwargs, 0, "exclude_current", False):
        current = mm.get_torch_device()
        devices = [d for d in devices if d != current]
    return devices


def apply(changes, mm):
    wrap_function(changes, mm, "get_all_torch_devices", _npu_devices)


PATCH = Patch(
    name="device_list",
    target="comfy.model_management",
    summary="get_all_torch_devices() returns the NPU devices",
    guard=guard,
    apply=apply,
    version=versions.comfyui,
)
