"""``should_use_bf16()`` answers True on the NPU where ComfyUI predates its NPU branch.

ComfyUI gained the NPU branch in v0.3.15; before that the function falls
through to CUDA queries. Detected by feature: the original's code does not
reference ``is_ascend_npu``. Everything upstream decides before its device
query stays upstream's: a non-NPU ``device`` argument, ``--force-fp32``,
DirectML, MPS and ``--cpu``; the wrapper answers only the question the
original would have sent to CUDA.
"""

from ascend_shim.engine import versions
from ascend_shim.engine.patching import Patch, argument
from ascend_shim.patches.shared.guards import device_type, handles_npu, npu_chosen, why_npu_not_chosen
from ascend_shim.patches.shared.wraps import wrap_function


def guard(mm):
    reason = why_npu_not_chosen(mm)
    if reason:
        return reason
    if not hasattr(mm, "should_use_bf16"):
        return "this ComfyUI has no should_use_bf16"
    if handles_npu(mm.should_use_bf16):
        return "should_use_bf16 already handles the NPU (v0.3.15+)"
    return None


def _upstream_decides_first(mm):
    """Whether a flag makes the original answer before it reaches CUDA."""
    if getattr(mm, "FORCE_FP32", False) or getattr(mm, "directml_enabled", False):
        return True
    return not npu_chosen(mm)  # --cpu, MPS, XPU: the original handles them


def _bf16_on_npu(mm, wrapped, instance, args, kwargs):
    device = argument(args, kwargs, 0, "device")
    if device is not None and device_type(device) != "npu":
        return wrapped(*args, **kwargs)  # the original runs here, unchanged: what raised is in the frames below
    if _upstream_decides_first(mm):
        return wrapped(*args, **kwargs)  # the original runs here, unchanged: what raised is in the frames below
    return True


def apply(changes, mm):
    wrap_function(changes, mm, "should_use_bf16", _bf16_on_npu)


PATCH = Patch(
    name="bf16_legacy",
    target="comfy.model_management",
    summary="should_use_bf16() is True on the NPU (ComfyUI before v0.3.15)",
    guard=guard,
    apply=apply,
    version=versions.comfyui,
)
