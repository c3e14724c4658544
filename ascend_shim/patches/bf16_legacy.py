"""``should_use_bf16()`` answers True on the NPU where ComfyUI predates its NPU branch.

ComfyUI gained the NPU branch in v0.3.15; before that the function falls
through to CUDA queries. Detected by feature: the original's code does not
reference ``is_ascend_npu``.
"""

from ascend_shim.patching import Patch
from ascend_shim.patches._guards import comfy_npu_active, handles_npu


def guard(mm):
    reason = comfy_npu_active(mm)
    if reason:
        return reason
    if not hasattr(mm, "should_use_bf16"):
        return "this ComfyUI has no should_use_bf16"
    if handles_npu(mm.should_use_bf16):
        return "should_use_bf16 already handles the NPU (v0.3.15+)"
    return None


def _bf16_on_npu(wrapped, instance, args, kwargs):
    device = args[0] if args else kwargs.get("device")
    if device is None or getattr(device, "type", device) == "npu":
        return True
    return wrapped(*args, **kwargs)


def apply(changes, mm):
    changes.wrap(mm, "should_use_bf16", _bf16_on_npu)


PATCH = Patch(
    name="bf16_legacy",
    target="comfy.model_management",
    summary="should_use_bf16() is True on the NPU (ComfyUI before v0.3.15)",
    guard=guard,
    apply=apply,
)
