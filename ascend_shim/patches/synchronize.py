"""``synchronize()`` synchronizes the NPU (upstream has no NPU branch: a no-op)."""

from ascend_shim.patching import Patch
from ascend_shim.patches._guards import npu_and_attribute


def _npu_synchronize(wrapped, instance, args, kwargs):
    import torch

    torch.npu.synchronize()
    return None


def apply(changes, mm):
    changes.wrap(mm, "synchronize", _npu_synchronize)


PATCH = Patch(
    name="synchronize",
    target="comfy.model_management",
    summary="synchronize() waits for the NPU",
    guard=npu_and_attribute("synchronize"),
    apply=apply,
)
