"""``is_nvidia()`` is False where ComfyUI computes on an Ascend NPU.

Upstream answers ``cpu_state == GPU and torch.version.cuda``, so a CUDA build
of torch on a 910B claims NVIDIA and every CUDA-only path follows. The NPU is
tested first (under ``transfer_to_npu`` CUDA even looks available); wherever
ComfyUI's own flags chose another device, the original answer stands.
"""

from ascend_shim.engine import versions
from ascend_shim.engine.patching import Patch
from ascend_shim.patches.shared.guards import npu_chosen, why_npu_not_chosen
from ascend_shim.patches.shared.wraps import wrap_function


def _is_nvidia(mm, wrapped, instance, args, kwargs):
    if npu_chosen(mm):
        return False
    return wrapped(*args, **kwargs)  # the original runs here, unchanged: what raised is in the frames below


def apply(changes, mm):
    wrap_function(changes, mm, "is_nvidia", _is_nvidia)


PATCH = Patch(
    name="is_nvidia",
    target="comfy.model_management",
    summary="is_nvidia() is False on the NPU (CUDA-build torch)",
    guard=why_npu_not_chosen,
    apply=apply,
    version=versions.comfyui,
)
