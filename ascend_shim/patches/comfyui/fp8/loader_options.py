"""A float8 ``dtype`` in a diffusion model's load options is not kept on an NPU without float8.

The Load Diffusion Model node's ``weight_dtype`` (fp8_e4m3fn, fp8_e5m2...)
arrives as ``model_options["dtype"]`` and bypasses ``unet_dtype``. On the NPU
the option is dropped for that call, so ComfyUI picks the weight dtype itself
(``fp8_dtypes`` keeps that choice off float8). The caller's dict is not changed.
"""

import importlib

from ascend_shim.patches.comfyui.fp8 import policy as fp8_policy
from ascend_shim.engine import versions
from ascend_shim.engine.patching import Patch, argument
from ascend_shim.patches.shared.guards import device_type
from ascend_shim.patches.shared.wraps import wrap_function
from ascend_shim.patches.comfyui.fp8.dtypes import is_8bit_float

DTYPE_OPTIONS = ("dtype", "weight_dtype")


def without_float8_dtype(model_options):
    """``model_options`` minus float8 weight dtypes (a copy), or None when it has none."""
    if not isinstance(model_options, dict):
        return None
    dropped = [k for k in DTYPE_OPTIONS if is_8bit_float(model_options.get(k))]
    if not dropped:
        return None
    return {k: v for k, v in model_options.items() if k not in dropped}


def _npu_load(model_options):
    mm = importlib.import_module("comfy.model_management")
    device = model_options.get("load_device") or mm.get_torch_device()
    return device_type(device) == "npu"


def _load_without_float8(sd_module, wrapped, instance, args, kwargs):
    options = argument(args, kwargs, 1, "model_options")
    replaced = without_float8_dtype(options)
    if replaced is None or not _npu_load(options):
        return wrapped(*args, **kwargs)  # the original runs here, unchanged: what raised is in the frames below
    if len(args) > 1:
        args = args[:1] + (replaced,) + tuple(args[2:])
    else:
        kwargs = dict(kwargs, model_options=replaced)
    return wrapped(*args, **kwargs)  # the original runs here (fp8 dtype options held in 16 bits): what raised is below


def guard(sd_module):
    if not hasattr(sd_module, "load_diffusion_model_state_dict"):
        return "this ComfyUI has no load_diffusion_model_state_dict"
    return fp8_policy.guard(importlib.import_module("comfy.model_management"))


def apply(changes, sd_module):
    wrap_function(changes, sd_module, "load_diffusion_model_state_dict", _load_without_float8)


PATCH = Patch(
    name="fp8_loader_options",
    target="comfy.sd",
    requires=("comfy.model_management",),
    summary="a float8 weight_dtype load option is dropped on an NPU without float8",
    guard=guard,
    apply=apply,
    version=versions.comfyui,
)
