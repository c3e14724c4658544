"""fp8 checkpoints are decoded on the host before any tensor of them reaches the NPU.

Every ComfyUI loader (checkpoint, diffusion model, text encoder) passes its
state dict through ``comfy.utils.convert_old_quants``, which turns legacy
``scaled_fp8`` files into ``comfy_quant`` layers. Right after it, the float8
entries under the converted prefix are decoded (``ascend_shim.npu_math.fp8_convert``):
to bf16, or with ``ASCEND_SHIM_FP8=int8`` to ComfyUI's own ``int8_tensorwise``
layers where this ComfyUI has that format and an NPU INT8 path serves them
(else bf16, said once: ``ascend_shim.patches.comfyui.fp8.effective``). W4A8 group scales
become float32.
Torch is imported on the first call, not with the patch.
"""

import importlib
import sys

from ascend_shim.patches.comfyui.fp8 import policy as fp8_policy
from ascend_shim.engine import versions
from ascend_shim.engine.patching import Patch, argument
from ascend_shim.patches.shared.wraps import wrap_function


def decoded_form() -> "str | None":
    """The form fp8 weights take now (``fp8_effective``: int8 only with an NPU INT8 path)."""
    from ascend_shim.patches.comfyui.fp8 import effective as fp8_effective

    return fp8_effective.current()[0]


def _form_note() -> str:
    from ascend_shim.patches.comfyui.fp8 import effective as fp8_effective

    form, why = fp8_effective.current()
    return "fp8 -> %s%s" % (form, " (%s)" % why if why else "")


def _decoding_convert(utils, wrapped, instance, args, kwargs):
    result = wrapped(*args, **kwargs)
    form = decoded_form()
    if form is None or not (isinstance(result, tuple) and len(result) == 2 and isinstance(result[0], dict)):
        return result
    from ascend_shim.npu_math import fp8_convert

    prefix = argument(args, kwargs, 1, "model_prefix", "") or ""
    fp8_convert.convert(result[0], prefix, form)
    return result


def guard(utils):
    if not hasattr(utils, "convert_old_quants"):
        return "this ComfyUI has no convert_old_quants"
    return fp8_policy.guard(importlib.import_module("comfy.model_management"))


def apply(changes, utils):
    wrap_function(changes, utils, "convert_old_quants", _decoding_convert)
    changes.note(_form_note())


def report():
    """What fp8 weights become here, once ``fp8_effective`` was loaded (by a decision on fp8)."""
    effective = sys.modules.get("ascend_shim.patches.comfyui.fp8.effective")
    return {"fp8": effective.report() if effective else None}


PATCH = Patch(
    name="fp8_state_dict",
    target="comfy.utils",
    requires=("comfy.model_management",),
    summary="fp8 checkpoints are decoded on the host (bf16 or int8) for an NPU without float8",
    guard=guard,
    apply=apply,
    version=versions.comfyui,
    report=report,
)
