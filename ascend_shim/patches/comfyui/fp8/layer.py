"""ComfyUI's mixed-precision layers never put a float8 weight on an NPU without float8.

``comfy.ops.mixed_precision_ops`` builds the layer classes of a quantized
model. Each class it defines with its own ``_load_from_state_dict`` reads
``comfy_quant`` entries (0.30: ``Linear``, ``MoEExperts``, ``Embedding``) and
turns a float8 one into a float8 ``QuantizedTensor``. Every such class of the
returned ops, found from the class itself rather than from a list of names,
gets a loader that first decodes the layer's own entries on the host
(``ascend_shim.npu_math.fp8_convert``), so a state dict that never went through
``convert_old_quants`` is covered too. Lookup tables (``torch.nn.Embedding``)
are always decoded to bf16: not every ComfyUI loads an int8 one.
"""

import importlib

from ascend_shim.patches.comfyui.fp8 import policy as fp8_policy
from ascend_shim.engine import versions
from ascend_shim.engine.patching import Patch
from ascend_shim.patches.comfyui.fp8 import state_dict as fp8_state_dict
from ascend_shim.patches.shared.wraps import wrap_function

_MARK = "_ascend_shim_fp8_decoding"


def may_hold_float8(state_dict, prefix):
    """Whether the layer's entries need a look: a comfy_quant entry, or an 8-bit float weight/bias."""
    if prefix + "comfy_quant" in state_dict:
        return True
    from ascend_shim.npu_math.fp8 import is_8bit_float  # torch is loaded by now

    return any(is_8bit_float(getattr(state_dict.get(prefix + name), "dtype", None))
               for name in ("weight", "bias"))


def decoding_loader(original):
    """A ``_load_from_state_dict`` that decodes the layer's float8 entries first."""

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        form = fp8_state_dict.decoded_form() if may_hold_float8(state_dict, prefix) else None
        if form == "int8" and _is_lookup_table(self):
            form = "bf16"
        if form is not None:
            from ascend_shim.npu_math import fp8_convert

            fp8_convert.convert(state_dict, prefix, form)
        return original(self, state_dict, prefix, *args, **kwargs)

    setattr(_load_from_state_dict, _MARK, True)
    return _load_from_state_dict


def _is_lookup_table(layer) -> bool:
    import torch

    return isinstance(layer, torch.nn.Embedding)


def quantized_layer_classes(operations) -> list:
    """The classes ``operations`` defines in its own body with their own loader.

    Those are made by the ``mixed_precision_ops`` call that returned it
    (changing them touches no other model), and their loaders are the ones
    that read ``comfy_quant``; classes inherited from ``manual_cast`` are not.
    """
    inside = getattr(operations, "__qualname__", "") + "."
    return [value for value in vars(operations).values()
            if isinstance(value, type) and value.__qualname__.startswith(inside)
            and callable(vars(value).get("_load_from_state_dict"))]


def _decoding_ops(ops, wrapped, instance, args, kwargs):
    operations = wrapped(*args, **kwargs)
    if isinstance(operations, type):
        for layer_class in quantized_layer_classes(operations):
            loader = vars(layer_class)["_load_from_state_dict"]
            if not getattr(loader, _MARK, False):
                layer_class._load_from_state_dict = decoding_loader(loader)
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
    summary="mixed-precision layers (Linear, MoE experts, embeddings...) decode float8 on the host for an NPU without float8",
    guard=guard,
    apply=apply,
    version=versions.comfyui,
)
