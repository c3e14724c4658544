"""ComfyUI's mixed-precision Linear never puts a float8 weight on an NPU without float8.

``comfy.ops.mixed_precision_ops`` builds the layer classes of a quantized
model; their ``Linear`` turns a ``comfy_quant`` float8 entry of the state dict
into a float8 ``QuantizedTensor`` and dequantizes it on the device at every
forward. Each class it returns gets a loader that first decodes the layer's
own entries on the host (``ascend_shim.fp8_convert``), so a state dict that
never went through ``convert_old_quants`` is covered too.
"""

import importlib

from ascend_shim import fp8_policy, versions
from ascend_shim.patching import Patch
from ascend_shim.patches import fp8_state_dict
from ascend_shim.patches._wraps import wrap_function

_MARK = "_ascend_shim_fp8_decoding"


def may_hold_float8(state_dict, prefix):
    """Whether the layer's entries need a look: a comfy_quant entry, or an 8-bit float weight/bias."""
    if prefix + "comfy_quant" in state_dict:
        return True
    for name in ("weight", "bias"):
        dtype = getattr(state_dict.get(prefix + name), "dtype", None)
        if getattr(dtype, "is_floating_point", False) and dtype.itemsize == 1:
            return True
    return False


def decoding_loader(original):
    """A ``_load_from_state_dict`` that decodes the layer's float8 entries first."""

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        form = fp8_state_dict.decoded_form() if may_hold_float8(state_dict, prefix) else None
        if form is not None:
            from ascend_shim import fp8_convert

            fp8_convert.convert(state_dict, prefix, form)
        return original(self, state_dict, prefix, *args, **kwargs)

    setattr(_load_from_state_dict, _MARK, True)
    return _load_from_state_dict


def _decoding_ops(ops, wrapped, instance, args, kwargs):
    operations = wrapped(*args, **kwargs)
    linear = getattr(operations, "Linear", None)
    loader = getattr(linear, "_load_from_state_dict", None)
    if loader is not None and not getattr(loader, _MARK, False):
        # a class made by this call: changing it touches no other model
        linear._load_from_state_dict = decoding_loader(loader)
    return operations


def guard(ops):
    if not hasattr(ops, "mixed_precision_ops"):
        return "this ComfyUI has no mixed_precision_ops"
    return fp8_policy.guard(importlib.import_module("comfy.model_management"))


def apply(changes, ops):
    wrap_function(changes, ops, "mixed_precision_ops", _decoding_ops)


PATCH = Patch(
    name="fp8_layer",
    target="comfy.ops",
    requires=("comfy.model_management",),
    summary="mixed-precision Linear layers decode float8 weights on the host for an NPU without float8",
    guard=guard,
    apply=apply,
    version=versions.comfyui,
)
