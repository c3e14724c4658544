"""``synchronize()`` synchronizes the NPU (upstream has no NPU branch: a no-op).

Only while ComfyUI computes on the NPU; under ``--cpu`` the original returns
at once, as upstream.
"""

from ascend_shim.engine import versions
from ascend_shim.engine.patching import Patch
from ascend_shim.patches.shared.guards import npu_and_attribute, npu_chosen
from ascend_shim.patches.shared.wraps import wrap_function


def _npu_synchronize(mm, wrapped, instance, args, kwargs):
    if not npu_chosen(mm):
        return wrapped(*args, **kwargs)  # the original runs here, unchanged: what raised is in the frames below
    import torch

    torch.npu.synchronize()  # type: ignore[attr-defined]
    return None


def apply(changes, mm):
    wrap_function(changes, mm, "synchronize", _npu_synchronize)


PATCH = Patch(
    name="synchronize",
    target="comfy.model_management",
    summary="synchronize() waits for the NPU",
    guard=npu_and_attribute("synchronize"),
    apply=apply,
    version=versions.comfyui,
)
