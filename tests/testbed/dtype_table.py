"""torch_npu's documented dtype table for the ops ComfyUI's models use (FACTS §8.2).

From Ascend/pytorch ``docs/zh/native_apis/pytorch_2-12-0/torch-nn-functional.md``
(@4142c2ac): ``conv1d`` fp16/fp32; ``conv_transpose1d`` fp32 only;
``conv_transpose2d`` fp16/fp32; ``silu``, ``tanh``, ``sigmoid`` fp16/fp32; ``pad``
with a non-constant mode fp16/fp32/fp64; ``interpolate`` bf16/fp16/fp32 but
"scale_factor not supported"; ``grid_sample`` no bf16; ``avg_pool3d`` not
supported (yet registered in 2.12.0). ``gelu`` takes ``approximate`` "tanh" or
none only, which is all torch accepts, so it has no entry.

The simulated NPU does not change a result for these: nobody knows what a real
card does with them (raise, cast or compute). It records each call outside the
table as ``(label, dtype)``, e.g. ``("silu", "bfloat16")`` or
``("interpolate(scale_factor)", "float32")``; ``npu_device.dtype_findings()``
reads the counts.

What reaches the backend is an aten op, so each documented function is watched
at the aten ops it arrives as: the function's own op where it reaches the
backend whole (CompositeImplicitAutograd ops do under ``inference_mode``, where
ComfyUI runs), else the op it decomposes into (``convolution`` for ``conv1d``,
``replication_pad1d`` for a replicate ``pad``). A circular ``pad`` decomposes
into slices and ``cat``, so outside ``inference_mode`` it is not seen.
"""

from __future__ import annotations

import torch

F16, BF16, F32, F64 = torch.float16, torch.bfloat16, torch.float32, torch.float64

ALLOWED = {
    "conv1d": (F16, F32),
    "conv_transpose1d": (F32,),
    "conv_transpose2d": (F16, F32),
    "silu": (F16, F32),
    "tanh": (F16, F32),
    "sigmoid": (F16, F32),
    "pad(reflect)": (F16, F32, F64),
    "pad(replicate)": (F16, F32, F64),
    "pad(circular)": (F16, F32, F64),
    "interpolate": (BF16, F16, F32),
    "interpolate(scale_factor)": (),  # documented as not supported at all
    "grid_sample": (F16, F32, F64),
    "avg_pool3d": (),  # documented as not supported
}


def _first_tensor(args, kwargs):
    for value in (*args, *kwargs.values()):
        if isinstance(value, torch.Tensor):
            return value
    return None


def _conv_label(args, kwargs):
    # convolution(input, weight, bias, stride, padding, dilation, transposed, output_padding, groups)
    x = args[0] if args else kwargs.get("input")
    transposed = args[6] if len(args) > 6 else kwargs.get("transposed", False)
    if x.dim() == 3:
        return "conv_transpose1d" if transposed else "conv1d"
    if x.dim() == 4 and transposed:
        return "conv_transpose2d"
    return None


def _pad_label(args, kwargs):
    mode = args[2] if len(args) > 2 else kwargs.get("mode", "constant")
    return None if mode == "constant" else "pad(%s)" % mode


def _upsample_label(args, kwargs):
    # the .vec overloads: (input, output_size, [align_corners,] scale_factors); the others end in
    # their scales (scales_h, scales_w, ...), set where the caller gave a scale factor
    scales = [value for value in (*args[2:], *kwargs.values()) if isinstance(value, float)
              or (isinstance(value, (list, tuple)) and value and all(isinstance(v, float) for v in value))]
    return "interpolate(scale_factor)" if scales else "interpolate"


def _constant(label):
    return lambda args, kwargs: label


_CONVOLUTIONS = ("aten::convolution", "aten::_convolution")
_UPSAMPLES = tuple("aten::" + name for name in (
    "upsample_nearest1d", "upsample_nearest2d", "upsample_nearest3d", "_upsample_nearest_exact1d",
    "_upsample_nearest_exact2d", "_upsample_nearest_exact3d", "upsample_linear1d", "upsample_bilinear2d",
    "_upsample_bilinear2d_aa", "upsample_bicubic2d", "_upsample_bicubic2d_aa", "upsample_trilinear3d"))

# schema name (overload left off) -> label of the call, or None where the call is not in the table
WATCHED = {
    "aten::conv1d": _constant("conv1d"),
    "aten::conv_transpose1d": _constant("conv_transpose1d"),
    "aten::conv_transpose2d": _constant("conv_transpose2d"),
    **{name: _conv_label for name in _CONVOLUTIONS},
    **{"aten::" + name: _constant(name.rstrip("_")) for name in ("silu", "silu_", "tanh", "tanh_", "sigmoid", "sigmoid_")},
    "aten::pad": _pad_label,
    "aten::_pad_circular": _constant("pad(circular)"),
    **{"aten::%s_pad%dd" % (kind, d): _constant("pad(%s)" % ("reflect" if kind == "reflection" else "replicate"))
       for kind in ("reflection", "replication") for d in (1, 2, 3)},
    **{name: _upsample_label for name in _UPSAMPLES},
    "aten::grid_sampler": _constant("grid_sample"),
    "aten::grid_sampler_2d": _constant("grid_sample"),
    "aten::grid_sampler_3d": _constant("grid_sample"),
    "aten::avg_pool3d": _constant("avg_pool3d"),
}


def finding(schema_name: str, args, kwargs):
    """``(label, dtype name)`` where this call lies outside the documented table, else None."""
    label = WATCHED[schema_name](args, kwargs)
    if label is None:
        return None
    x = _first_tensor(args, kwargs)
    if x is None or x.dtype in ALLOWED[label]:
        return None
    return label, str(x.dtype).removeprefix("torch.")
