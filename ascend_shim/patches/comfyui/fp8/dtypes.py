"""No float8 weight dtype is chosen for an NPU without float8.

ComfyUI stores weights as fp8 when ``--fp8_e4m3fn-unet`` / ``--fp8_e5m2-unet``
/ ``--fp8_e4m3fn-text-enc``... ask for it, when a diffusion model's file is
fp8 and too big for the card (``unet_dtype``), and wherever
``pick_weight_dtype`` keeps a file's fp8 (``supports_cast(device, dtype)``,
which already answers False for fp8 on MPS). On the NPU:

- ``supports_cast(npu, float8)`` is False, so ``pick_weight_dtype`` falls back
  as ComfyUI designed, and a text encoder stays on the NPU;
- ``unet_dtype`` answers what ComfyUI would choose without the fp8 file
  dtype, and for an fp8 flag the model's first non-fp8 supported dtype;
- ``text_encoder_dtype`` answers bf16 (fp16 where ComfyUI says no bf16) for an
  fp8 flag.

The weights are then held in 16 bits; ``ASCEND_SHIM_FP8`` decides only how
fp8 *files* are decoded. Calls about any other device are left alone.
"""

from typing import Any

from ascend_shim.patches.comfyui.fp8 import policy as fp8_policy
from ascend_shim.engine import versions
from ascend_shim.engine.patching import Patch, argument
from ascend_shim.patches.shared.guards import device_type
from ascend_shim.patches.shared.wraps import wrap_function

FUNCTIONS = ("supports_cast", "unet_dtype", "text_encoder_dtype")


def is_8bit_float(dtype: Any) -> bool:
    # imported on call: the patches load before ComfyUI has imported torch
    from ascend_shim.npu_math.fp8 import is_8bit_float as one_byte_float

    return one_byte_float(dtype)


def _on_npu(mm, device):
    if device is None:
        device = mm.get_torch_device()
    return device_type(device) == "npu"


def _supports_cast(mm, wrapped, instance, args, kwargs):
    device, dtype = argument(args, kwargs, 0, "device"), argument(args, kwargs, 1, "dtype")
    if is_8bit_float(dtype) and _on_npu(mm, device):
        return False
    return wrapped(*args, **kwargs)  # the original runs here, unchanged: what raised is in the frames below


def _unet_dtype(mm, wrapped, instance, args, kwargs):
    chosen = wrapped(*args, **kwargs)
    device = argument(args, kwargs, 0, "device")
    if not is_8bit_float(chosen) or not _on_npu(mm, device):
        return chosen
    call = dict(kwargs)
    for position, name in enumerate(("device", "model_params", "supported_dtypes")):
        if len(args) > position:
            call[name] = args[position]
    call["weight_dtype"] = None  # what ComfyUI picks when the file's fp8 does not count
    chosen = wrapped(**call)
    if not is_8bit_float(chosen):
        return chosen
    import torch

    supported = call.get("supported_dtypes") or (torch.float16, torch.bfloat16, torch.float32)
    return next((d for d in supported if not is_8bit_float(d)), torch.float32)


def _text_encoder_dtype(mm, wrapped, instance, args, kwargs):
    chosen = wrapped(*args, **kwargs)
    device = argument(args, kwargs, 0, "device")
    if not is_8bit_float(chosen) or not _on_npu(mm, device):
        return chosen
    import torch

    return torch.bfloat16 if mm.should_use_bf16(device) else torch.float16


WRAPPERS = {"supports_cast": _supports_cast, "unet_dtype": _unet_dtype, "text_encoder_dtype": _text_encoder_dtype}


def guard(mm):
    if not any(hasattr(mm, name) for name in FUNCTIONS):
        return "this ComfyUI has no %s" % " / ".join(FUNCTIONS)
    return fp8_policy.guard(mm)


def apply(changes, mm):
    for name in FUNCTIONS:
        if hasattr(mm, name):
            wrap_function(changes, mm, name, WRAPPERS[name])
            changes.note(name)


PATCH = Patch(
    name="fp8_dtypes",
    target="comfy.model_management",
    summary="no float8 weight dtype is chosen for an NPU without float8 (--fp8_* flags, supports_cast)",
    guard=guard,
    apply=apply,
    version=versions.comfyui,
)
