"""``is_oom()`` recognises an NPU out-of-memory in every torch_npu wording.

ComfyUI decides on OOM with ``is_oom`` (``raise_non_oom`` in VAE decode/encode, which then
retries tiled; the prompt's handler, which frees models and prints the memory summary). It
knows ``torch.OutOfMemoryError`` (newer torch_npu) and ``AcceleratorError``; older torch_npu
raise a RuntimeError "NPU out of memory. Tried to allocate ..." and ACL allocation failures
(error 207001, EL0004) are RuntimeErrors too. Only those exact wordings count
(``engine.npu.npu_out_of_memory``): any other error keeps its meaning. The card an OOM names
is kept for ``debug_memory_summary`` (patch memory_summary).
"""

from ascend_shim.engine import npu as _npu
from ascend_shim.engine import versions
from ascend_shim.engine.patching import Patch, argument
from ascend_shim.patches.shared.guards import npu_and_attribute
from ascend_shim.patches.shared.wraps import wrap_function

_last: dict = {"card": None}  # the card the last recognised OOM named


def last_oom_card():
    return _last["card"]


def _is_oom(mm, wrapped, instance, args, kwargs):
    if wrapped(*args, **kwargs):
        oom = True
    else:
        exc = argument(args, kwargs, 0, "e")
        oom = isinstance(exc, BaseException) and _npu.npu_out_of_memory(exc)
    if oom:
        exc = argument(args, kwargs, 0, "e")
        _last["card"] = _npu.oom_card(exc) if isinstance(exc, BaseException) else None
    return oom


def apply(changes, mm):
    wrap_function(changes, mm, "is_oom", _is_oom)


PATCH = Patch(
    name="oom",
    target="comfy.model_management",
    summary="is_oom() knows torch_npu's out-of-memory errors (VAE retries tiled, models are freed)",
    guard=npu_and_attribute("is_oom"),
    apply=apply,
    version=versions.comfyui,
)
