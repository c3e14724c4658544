"""``is_nvidia()`` is False on an Ascend NPU.

Upstream answers ``cpu_state == GPU and torch.version.cuda``, so a CUDA build
of torch on a 910B claims NVIDIA and every CUDA-only path follows. The NPU is
tested first (under ``transfer_to_npu`` CUDA even looks available); elsewhere
the original answer stands, but only while CUDA is really available.
"""

from ascend_shim.patching import Patch
from ascend_shim.patches._guards import comfy_npu_active, model_management


def _is_nvidia(wrapped, instance, args, kwargs):
    if comfy_npu_active(model_management()) is None:
        return False
    if not wrapped(*args, **kwargs):
        return False
    import torch

    return bool(torch.cuda.is_available())


def apply(changes, mm):
    changes.wrap(mm, "is_nvidia", _is_nvidia)


PATCH = Patch(
    name="is_nvidia",
    target="comfy.model_management",
    summary="is_nvidia() is False on the NPU (CUDA-build torch)",
    guard=comfy_npu_active,
    apply=apply,
)
