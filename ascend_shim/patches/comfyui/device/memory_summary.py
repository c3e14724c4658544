"""``debug_memory_summary()`` reports NPU memory instead of raising KeyError.

ComfyUI calls it from its out-of-memory handler; on a CUDA build without a
driver ``torch.cuda.memory_summary()`` raises and hides the real OOM. The summary is
of the card the OOM named (patch oom), else of this thread's card. Where ComfyUI's flags
chose another device, the original answers.
"""

from ascend_shim.engine import versions
from ascend_shim.engine.patching import Patch
from ascend_shim.patches.shared.guards import npu_and_attribute, npu_chosen
from ascend_shim.patches.shared.wraps import wrap_function


def _npu_memory_summary(mm, wrapped, instance, args, kwargs):
    if not npu_chosen(mm):
        return wrapped(*args, **kwargs)  # the original runs here, unchanged: what raised is in the frames below
    import torch

    from ascend_shim.patches.comfyui.device.oom import last_oom_card

    card = last_oom_card()
    try:
        if card is not None and 0 <= card < torch.npu.device_count():  # type: ignore[attr-defined]
            return torch.npu.memory_summary(card)  # type: ignore[attr-defined]
        return torch.npu.memory_summary()  # type: ignore[attr-defined]
    except Exception as exc:  # never mask the OOM being reported
        return "NPU memory summary unavailable: %s" % exc


def apply(changes, mm):
    wrap_function(changes, mm, "debug_memory_summary", _npu_memory_summary)


PATCH = Patch(
    name="memory_summary",
    target="comfy.model_management",
    summary="debug_memory_summary() shows NPU memory in the OOM handler",
    guard=npu_and_attribute("debug_memory_summary"),
    apply=apply,
    version=versions.comfyui,
)
