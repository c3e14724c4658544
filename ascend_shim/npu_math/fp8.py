"""FP8 weights decoded on the host, for NPUs that cannot hold float8.

Pure functions of CPU tensors. ``decode`` gives ``weight * scale`` in bf16:
float8_e4m3fn and float8_e5m2 are subsets of bf16 (8 exponent bits, 7
mantissa bits), so without a scale the conversion is exact, and with one the
only rounding is the product's. ``requantize_int8`` gives symmetric
per-output-channel int8 plus a float32 ``[rows, 1]`` scale, the weight form
comfy-kitchen's ``TensorWiseINT8Layout`` takes.

Large tensors are processed a block of rows at a time, so the float32
working copy stays small next to the result.
"""

from typing import Any

import torch

# The 8-bit float formats torch may define; a CPU torch converts each one it
# has to float32. Anything else of 8 bits is refused, never guessed at.
FLOAT8_NAMES = ("float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz", "float8_e8m0fnu")
INT8_MAX = 127
BLOCK_ELEMENTS = 1 << 22  # float32 working copy per block: 16 MiB


class Fp8DecodeError(ValueError):
    """A float8 tensor (or its scale) the shim cannot turn into a correct weight."""


def decodable_dtypes():
    return frozenset(getattr(torch, name) for name in FLOAT8_NAMES if hasattr(torch, name))


def is_8bit_float(dtype: Any) -> bool:
    """True for every one-byte floating dtype: the float8 family and packed float4
    (False for None or anything that is not a dtype)."""
    return bool(getattr(dtype, "is_floating_point", False) and getattr(dtype, "itemsize", 0) == 1)


def check_decodable(dtype, what: str) -> None:
    if is_8bit_float(dtype) and dtype not in decodable_dtypes():
        raise Fp8DecodeError(
            "%s: %s is an 8-bit float this torch cannot convert (known: %s)"
            % (what, dtype, ", ".join(sorted(str(d) for d in decodable_dtypes())))
        )


def check_scale(scale, rows: int, what: str):
    """The scale as float32, shaped ``()`` or ``(rows, 1)``; None stays None."""
    if scale is None:
        return None
    if not isinstance(scale, torch.Tensor):
        scale = torch.tensor(scale)
    check_decodable(scale.dtype, what)
    if not scale.dtype.is_floating_point:
        raise Fp8DecodeError("%s: a scale must be a float tensor, got %s" % (what, scale.dtype))
    scale = scale.detach().to(device="cpu", dtype=torch.float32)
    if scale.numel() == 1:
        scale = scale.reshape(())
    elif scale.numel() == rows:
        scale = scale.reshape(rows, 1)
    else:
        raise Fp8DecodeError(
            "%s: a scale of shape %s fits neither one value per tensor nor one per row (%d rows)"
            % (what, tuple(scale.shape), rows)
        )
    if not bool(torch.isfinite(scale).all()):
        raise Fp8DecodeError("%s: the scale holds inf or nan" % what)
    return scale


def _row_blocks(rows: int, columns: int):
    step = max(1, BLOCK_ELEMENTS // max(columns, 1))
    for start in range(0, rows, step):
        yield slice(start, min(rows, start + step))


def _rows_of(weight):
    """``weight`` as a 2-D ``(rows, columns)`` view: rows are output channels."""
    if weight.dim() == 0:
        return weight.reshape(1, 1)
    return weight.reshape(weight.shape[0], -1)


def _block_scale(scale, block):
    return scale if scale.dim() == 0 else scale[block]


def decode(weight, scale=None, dtype=torch.bfloat16, what="weight"):
    """``weight * scale`` in ``dtype`` (a new CPU tensor of ``weight``'s shape)."""
    check_decodable(weight.dtype, what)
    weight = weight.detach().to("cpu")
    rows = _rows_of(weight)
    scale = check_scale(scale, rows.shape[0], what + " scale")
    if scale is None:
        return weight.to(dtype)
    out = torch.empty(weight.shape, dtype=dtype)
    out_rows = out.view(rows.shape)
    for block in _row_blocks(*rows.shape):
        out_rows[block] = (rows[block].to(torch.float32) * _block_scale(scale, block)).to(dtype)
    return out


def requantize_int8(weight, scale=None, what="weight"):
    """Symmetric per-output-channel int8 of ``weight * scale``: ``(qdata, scale)``.

    ``qdata`` has ``weight``'s shape; ``scale`` is float32 ``(rows, 1)`` with
    ``qdata * scale`` approximating the decoded weight (an all-zero row keeps
    scale 1).
    """
    check_decodable(weight.dtype, what)
    if weight.dim() < 1:
        raise Fp8DecodeError("%s: per-channel int8 needs a weight with rows, got a scalar" % what)
    weight = weight.detach().to("cpu")
    rows = _rows_of(weight)
    scale = check_scale(scale, rows.shape[0], what + " scale")
    qdata = torch.empty(rows.shape, dtype=torch.int8)
    qscale = torch.empty(rows.shape[0], 1, dtype=torch.float32)
    for block in _row_blocks(*rows.shape):
        values = rows[block].to(torch.float32)
        if scale is not None:
            values = values * _block_scale(scale, block)
        amax = values.abs().amax(dim=1, keepdim=True)
        step = torch.where(amax > 0, amax / INT8_MAX, torch.ones_like(amax))
        qdata[block] = torch.round(values / step).clamp_(-INT8_MAX, INT8_MAX).to(torch.int8)
        qscale[block] = step
    return qdata.view(weight.shape), qscale


def decode_group_scales(s_rel, what="weight_s_rel"):
    """W4A8 group scales stored as float8_e4m3fn (or as its bytes in uint8) -> float32."""
    if s_rel.dtype == torch.uint8:
        s_rel = s_rel.view(torch.float8_e4m3fn)
    check_decodable(s_rel.dtype, what)
    values = s_rel.detach().to(device="cpu", dtype=torch.float32)
    if not bool(torch.isfinite(values).all()):
        raise Fp8DecodeError("%s: the group scales hold inf or nan" % what)
    return values
