"""Fake ``comfy.quant_ops`` (shape v0_30): the bridge to the *real* comfy_kitchen.

As upstream, at import:
- ``import comfy_kitchen as ck`` (so ``comfy.quant_ops.ck`` exists); on
  ImportError ``_CK_AVAILABLE = False`` and stub classes stand in;
- kitchen's ``cuda`` backend is disabled unless ``torch.version.cuda`` >= 13,
  and ``triton`` unless ``--enable-triton-backend`` (with triton importable);
- ``QUANT_ALGOS`` maps format -> storage dtype / layout name; it contains
  ``"int8_tensorwise"`` -> ``TensorWiseINT8Layout``, and (v0.30) the two
  4-bit INT8-compute formats ``"convrot_w4a4"`` -> ``TensorCoreConvRotW4A4Layout``
  and ``"asym_w4a8_int8"`` -> ``AsymW4A8Int8Layout`` (listed even without
  kitchen; all three have ``quantize_input: False``).
Optional kitchen layouts are picked up by feature: v0.30 pins kitchen 0.2.27,
the first release with ``AsymW4A8Int8Layout``.
"""
import logging

import torch

from comfy.cli_args import args

try:
    import comfy_kitchen as ck
    from comfy_kitchen.tensor import (  # noqa: F401  (re-exported, as upstream)
        QuantizedTensor,
        QuantizedLayout,
        TensorCoreFP8Layout as _CKFp8Layout,
        TensorCoreNVFP4Layout as _CKNvfp4Layout,
        TensorWiseINT8Layout as _CKTensorWiseINT8Layout,
        register_layout_op,
        register_layout_class,
        get_layout_class,
    )
    _CK_AVAILABLE = True
    if torch.version.cuda is None:
        ck.registry.disable("cuda")
    else:
        cuda_version = tuple(map(int, str(torch.version.cuda).split(".")))
        if cuda_version < (13,):
            ck.registry.disable("cuda")
            logging.warning("WARNING: You need pytorch with cu130 or higher to use optimized CUDA operations.")
    if args.enable_triton_backend:
        try:
            import triton  # noqa: F401
        except ImportError as e:
            logging.error(f"Failed to import triton, Error: {e}")
            ck.registry.disable("triton")
    else:
        ck.registry.disable("triton")
except ImportError as e:
    logging.error(f"Failed to import comfy_kitchen, Error: {e}, fp8 and fp4 support will not be available.")
    _CK_AVAILABLE = False

    class QuantizedTensor:
        pass

    class QuantizedLayout:
        pass

    class _CKFp8Layout:
        pass

    class _CKNvfp4Layout:
        pass

    class _CKTensorWiseINT8Layout:
        pass

    def register_layout_op(*a, **k):
        return lambda f: f

    def register_layout_class(name, cls):
        pass

    def get_layout_class(name):
        return None

def _optional_layout(name):
    """A kitchen layout class this release may lack (a stand-in when it does)."""
    if _CK_AVAILABLE:
        import comfy_kitchen.tensor as _tensor
        found = getattr(_tensor, name, None)
        if found is not None:
            return found, True
    return type(name, (), {}), False


_CKTensorCoreConvRotW4A4Layout, _CK_CONVROT_W4A4_AVAILABLE = _optional_layout("TensorCoreConvRotW4A4Layout")
_CKAsymW4A8Int8Layout, _CK_W4A8_AVAILABLE = _optional_layout("AsymW4A8Int8Layout")

_CK_MXFP8_AVAILABLE = False
if _CK_AVAILABLE:
    try:
        from comfy_kitchen.tensor import TensorCoreMXFP8Layout as _CKMxfp8Layout
        _CK_MXFP8_AVAILABLE = True
    except ImportError:
        pass
if not _CK_MXFP8_AVAILABLE:
    class _CKMxfp8Layout:
        pass


class TensorCoreFP8E4M3Layout(_CKFp8Layout):
    FP8_DTYPE = torch.float8_e4m3fn


class TensorCoreFP8E5M2Layout(_CKFp8Layout):
    FP8_DTYPE = torch.float8_e5m2


TensorCoreFP8Layout = TensorCoreFP8E4M3Layout
TensorCoreNVFP4Layout = _CKNvfp4Layout
TensorCoreMXFP8Layout = _CKMxfp8Layout
TensorWiseINT8Layout = _CKTensorWiseINT8Layout
TensorCoreConvRotW4A4Layout = _CKTensorCoreConvRotW4A4Layout
AsymW4A8Int8Layout = _CKAsymW4A8Int8Layout

register_layout_class("TensorCoreFP8Layout", TensorCoreFP8Layout)
register_layout_class("TensorCoreFP8E4M3Layout", TensorCoreFP8E4M3Layout)
register_layout_class("TensorCoreFP8E5M2Layout", TensorCoreFP8E5M2Layout)
register_layout_class("TensorCoreNVFP4Layout", TensorCoreNVFP4Layout)
register_layout_class("TensorWiseINT8Layout", TensorWiseINT8Layout)
if _CK_CONVROT_W4A4_AVAILABLE:
    register_layout_class("TensorCoreConvRotW4A4Layout", TensorCoreConvRotW4A4Layout)
if _CK_W4A8_AVAILABLE:
    register_layout_class("AsymW4A8Int8Layout", AsymW4A8Int8Layout)
if _CK_MXFP8_AVAILABLE:
    register_layout_class("TensorCoreMXFP8Layout", TensorCoreMXFP8Layout)

QUANT_ALGOS = {
    "float8_e4m3fn": {"storage_t": torch.float8_e4m3fn, "parameters": {"weight_scale", "input_scale"},
                      "comfy_tensor_layout": "TensorCoreFP8E4M3Layout"},
    "float8_e5m2": {"storage_t": torch.float8_e5m2, "parameters": {"weight_scale", "input_scale"},
                    "comfy_tensor_layout": "TensorCoreFP8E5M2Layout"},
    "nvfp4": {"storage_t": torch.uint8, "parameters": {"weight_scale", "weight_scale_2", "input_scale"},
              "comfy_tensor_layout": "TensorCoreNVFP4Layout", "group_size": 16},
}
if _CK_MXFP8_AVAILABLE:
    QUANT_ALGOS["mxfp8"] = {"storage_t": torch.float8_e4m3fn, "parameters": {"weight_scale", "input_scale"},
                            "comfy_tensor_layout": "TensorCoreMXFP8Layout", "group_size": 32}
# weight-only (listed even without kitchen, as upstream): activations stay
# float and the kernel quantizes them per row
QUANT_ALGOS["int8_tensorwise"] = {"storage_t": torch.int8, "parameters": {"weight_scale"},
                                  "comfy_tensor_layout": "TensorWiseINT8Layout", "quantize_input": False}
QUANT_ALGOS["convrot_w4a4"] = {"storage_t": torch.int8, "parameters": {"weight_scale"},
                               "comfy_tensor_layout": "TensorCoreConvRotW4A4Layout", "quantize_input": False}
QUANT_ALGOS["asym_w4a8_int8"] = {"storage_t": torch.int8, "parameters": {"weight_scale"},
                                 "comfy_tensor_layout": "AsymW4A8Int8Layout", "quantize_input": False}
