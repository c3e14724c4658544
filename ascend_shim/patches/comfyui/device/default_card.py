"""``get_torch_device()`` answers each thread with the card the launcher named first.

ComfyUI's device on the NPU is ``torch.npu.current_device()``: the calling thread's card,
npu:0 for a thread that never chose one, as CUDA's is the first card its variable names.
ACL takes card ids in ascending order only, so where ``--default-device 7`` or
``CUDA_VISIBLE_DEVICES=7,3`` named another card first, that card is not npu:0
(``startup.visible_devices``). The first time a thread asks, it is bound to that card
(``engine.default_card``); then ComfyUI's own function answers. A thread that chose its
card through ComfyUI keeps it, and a run whose device is not the NPU is not touched.
"""

from ascend_shim.engine import default_card, versions
from ascend_shim.engine.patching import Patch
from ascend_shim.patches.shared.guards import device_type, npu_and_attribute
from ascend_shim.patches.shared.wraps import wrap_function

_npu_and_function = npu_and_attribute("get_torch_device")


def guard(mm):
    reason = _npu_and_function(mm)
    if reason:
        return reason
    if default_card.index() is None:
        return "ComfyUI computes on npu:0, the first card named (nothing to select)"
    return None


def _get_torch_device(mm, wrapped, instance, args, kwargs):
    device = wrapped(*args, **kwargs)
    if default_card.thread_bound() or device_type(device) != "npu":
        return device
    if default_card.bind_thread():
        return wrapped(*args, **kwargs)  # ComfyUI's own answer, on the card now selected
    return device


def apply(changes, mm):
    wrap_function(changes, mm, "get_torch_device", _get_torch_device)


PATCH = Patch(
    name="default_card",
    target="comfy.model_management",
    summary="get_torch_device() is the card the launcher named first in every thread (ACL takes ids ascending)",
    guard=guard,
    apply=apply,
    version=versions.comfyui,
)
