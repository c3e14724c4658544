"""Load safetensors into RAM instead of leaving them as file-mapping views on the NPU.

Pages of a mapped file fault in lazily during the host-to-NPU copy, which the
CANN driver's DMA cannot do: the load spins at 100% system CPU (the user's
stuck text encoder). ``comfy.utils.DISABLE_MMAP`` is read at call time, so
setting it after import is enough (v0.3.45+). Older versions get the
file-mapped tensors of a load copied into RAM: only CPU tensors of a
safetensors file (what safetensors maps); tensors already on a device and
``torch.load`` results own their memory and are returned as loaded.
``ASCEND_SHIM_MMAP=keep`` opts out; ``--disable-mmap`` works either way; a
ComfyUI running on another device (``--cpu``...) is left alone.
"""

import importlib

from ascend_shim.startup import config as _config
from ascend_shim.engine import versions
from ascend_shim.engine.patching import Patch, argument
from ascend_shim.patches.shared.guards import why_npu_not_chosen
from ascend_shim.patches.shared.wraps import wrap_function

SAFETENSORS_SUFFIXES = (".safetensors", ".sft")  # the suffixes load_torch_file maps


def guard(utils):
    if _config.get().mmap == "keep":
        return "kept by ASCEND_SHIM_MMAP=keep"
    reason = why_npu_not_chosen(importlib.import_module("comfy.model_management"))
    if reason:
        return reason
    if not hasattr(utils, "DISABLE_MMAP") and not hasattr(utils, "load_torch_file"):
        return "this ComfyUI has neither DISABLE_MMAP nor load_torch_file"
    return None


def is_mapped_load(path):
    """Whether ``load_torch_file(path)`` hands out views of a file mapping."""
    return isinstance(path, str) and path.lower().endswith(SAFETENSORS_SUFFIXES)


def copy_cpu_tensors(state_dict):
    """``state_dict`` with its CPU tensors copied into RAM, device tensors as they are."""
    import torch

    copied = {}
    for key, value in state_dict.items():
        if isinstance(value, torch.Tensor) and value.device.type == "cpu":
            value = value.clone()
        copied[key] = value
    return copied


def _copying_load(utils, wrapped, instance, args, kwargs):
    result = wrapped(*args, **kwargs)
    if not is_mapped_load(argument(args, kwargs, 0, "ckpt")):
        return result
    if isinstance(result, tuple) and result and isinstance(result[0], dict):
        return (copy_cpu_tensors(result[0]),) + result[1:]  # (state_dict, metadata)
    if isinstance(result, dict):
        return copy_cpu_tensors(result)
    return result


def apply(changes, utils):
    if hasattr(utils, "DISABLE_MMAP"):
        if utils.DISABLE_MMAP:
            changes.note("mmap already off (--disable-mmap)")
        else:
            changes.assign(utils, "DISABLE_MMAP", True)
            changes.note("DISABLE_MMAP=True")
    else:
        wrap_function(changes, utils, "load_torch_file", _copying_load)
        changes.note("load_torch_file copies file-mapped tensors")


PATCH = Patch(
    name="mmap",
    target="comfy.utils",
    requires=("comfy.model_management",),
    summary="safetensors are read into RAM, not left file-mapped, on the NPU",
    guard=guard,
    apply=apply,
    version=versions.comfyui,
)
