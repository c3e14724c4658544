"""fp8 / nvfp4 / mxfp8 compute probes answer False unless the device is CUDA.

``comfy.ops.pick_operations`` calls these first and unconditionally; on a
CUDA-build torch they reach ``torch.cuda.get_device_properties`` and raise
"Found no NVIDIA driver". The wrapper resolves the device (argument, else
``get_torch_device()``) and never touches ``torch.cuda`` for a non-CUDA one.
``--supports-fp8-compute`` (``SUPPORT_FP8_OPS``) keeps its meaning: upstream
answers True for it before any CUDA query.
"""

from ascend_shim.engine import versions
from ascend_shim.engine.patching import Patch
from ascend_shim.patches.shared.guards import npu_and_attribute, probed_device_type
from ascend_shim.patches.shared.wraps import wrap_function

PROBES = ("supports_fp8_compute", "supports_nvfp4_compute", "supports_mxfp8_compute")


def _cuda_only(mm, wrapped, instance, args, kwargs):
    if probed_device_type(args, kwargs, mm) != "cuda":
        return False
    return wrapped(*args, **kwargs)  # the original runs here, unchanged: what raised is in the frames below


def _fp8_cuda_only(mm, wrapped, instance, args, kwargs):
    if getattr(mm, "SUPPORT_FP8_OPS", False):
        return wrapped(*args, **kwargs)  # the original runs here, unchanged: what raised is in the frames below
    return _cuda_only(mm, wrapped, instance, args, kwargs)


def apply(changes, mm):
    for name in PROBES:
        if hasattr(mm, name):
            wrapper = _fp8_cuda_only if name == "supports_fp8_compute" else _cuda_only
            wrap_function(changes, mm, name, wrapper)
            changes.note(name)


PATCH = Patch(
    name="compute_probes",
    target="comfy.model_management",
    summary="fp8/nvfp4/mxfp8 probes are False off CUDA instead of raising",
    guard=npu_and_attribute(*PROBES),
    apply=apply,
    version=versions.comfyui,
)
