"""Load safetensors into RAM instead of leaving them as file-mapping views on the NPU.

Pages of a mapped file fault in lazily during the host-to-NPU copy, which the
CANN driver's DMA cannot do: the load spins at 100% system CPU (the user's
stuck text encoder). ``comfy.utils.DISABLE_MMAP`` is read at call time, so
setting it after import is enough (v0.3.45+); older versions get the loaded
tensors copied. ``ASCEND_SHIM_MMAP=keep`` opts out; ``--disable-mmap`` works
either way.
"""

from ascend_shim import _config
from ascend_shim.patching import Patch
from ascend_shim.patches._guards import comfy_npu_active, model_management


def guard(utils):
    if _config.get().mmap == "keep":
        return "kept by ASCEND_SHIM_MMAP=keep"
    reason = comfy_npu_active(model_management())
    if reason:
        return reason
    if not hasattr(utils, "DISABLE_MMAP") and not hasattr(utils, "load_torch_file"):
        return "this ComfyUI has neither DISABLE_MMAP nor load_torch_file"
    return None


def _detach_from_file(value):
    import torch

    if isinstance(value, torch.Tensor):
        return value.clone()
    if isinstance(value, dict):
        return {k: _detach_from_file(v) for k, v in value.items()}
    return value


def _copying_load(wrapped, instance, args, kwargs):
    result = wrapped(*args, **kwargs)
    if isinstance(result, tuple):  # (state_dict, metadata)
        return (_detach_from_file(result[0]),) + result[1:]
    return _detach_from_file(result)


def apply(changes, utils):
    if hasattr(utils, "DISABLE_MMAP"):
        if utils.DISABLE_MMAP:
            changes.note("mmap already off (--disable-mmap)")
        else:
            changes.assign(utils, "DISABLE_MMAP", True)
            changes.note("DISABLE_MMAP=True")
    else:
        changes.wrap(utils, "load_torch_file", _copying_load)
        changes.note("load_torch_file copies tensors")


PATCH = Patch(
    name="mmap",
    target="comfy.utils",
    requires=("comfy.model_management",),
    summary="safetensors are read into RAM, not left file-mapped, on the NPU",
    guard=guard,
    apply=apply,
)
