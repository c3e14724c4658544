"""CPU reference implementations of the torch_npu quant ops (as torch_npu's op docs
and kernels describe them).

They check what the real ops check, compute on the CPU data behind the npu
wrappers, and record each accepted call in ``torch_npu._testbed``.

``TESTBED_QMM_CORRUPT=<name>[,<name>]`` (read at every call) makes the ops
subtly wrong in the ways listed in ``CORRUPTIONS``, one defect each, so the
tests can prove that ``python -m ascend_shim selftest`` catches a device that
is wrong about a call the shim makes.
"""

from __future__ import annotations

import os

import torch

from testbed import npu_device

from . import _testbed

_DYN = "npu_dynamic_quant"
_QMM = "npu_quant_matmul"
_FLOAT_OUT = (torch.float16, torch.bfloat16)
# c10::ScalarType codes accepted where the 26.x API takes an int dtype
_DTYPE_CODES = {1: torch.int8, 3: torch.int32, 5: torch.float16, 6: torch.float32, 15: torch.bfloat16}
_INT8_RANGE = (-128, 127)
_INT32_RANGE = (-(2**31), 2**31 - 1)

# rows per M tile and the K/N alignment a defective kernel might assume
_M_TILE = 128
_ALIGN = 16

CORRUPTIONS = {
    # npu_quant_matmul
    "pertoken_dropped": "the pertoken scale is ignored",
    "scale_twice": "the weight scale is applied twice",
    "x2_strides_ignored": "x2 is read as a contiguous (k, n) tensor whatever its strides (.t() views)",
    "bias_ignored": "a float bias is ignored",
    "fp16_zeros": "float16 output is all zeros",
    "bf16_bias_as_fp16": "a bfloat16 bias is read as float16 bits",
    "fp16_bias_as_bf16": "a float16 bias is read as bfloat16 bits",
    "per_channel_scale_first": "a per-channel (n,) scale uses its first element for every column",
    "odd_m_tail": "for an odd m > 1 the last row repeats the row before it",
    "m_tile": "rows past the first %d-row tile use the pertoken scale of the row one tile up" % _M_TILE,
    "k_tail": "for k not a multiple of %d the last k %% %d columns are left out of the sum" % (_ALIGN, _ALIGN),
    "n_tail": "for n not a multiple of %d the last n %% %d output columns are zeros" % (_ALIGN, _ALIGN),
    # npu_dynamic_quant
    "dyn_round_toward_zero": "codes are truncated instead of rounded half to even",
    "dyn_strides_ignored": "the input is read as contiguous whatever its strides",
    "dyn_offset_ignored": "the input is read from the start of its storage (storage offset ignored)",
    "zero_row_nan": "an all-zero row gets a NaN scale",
}


# What int32 output (``output_dtype=torch.int32``) does; ``TESTBED_QMM_INT32``, read at every call.
INT32_OUTPUT = {
    "exact": "op-plugin 7.0.0+ on Atlas A2: the int32 accumulator times the scale, exact with a unit "
             "scale (the vendor's test compares it with an exact int32 matmul)",
    "refused": "an op-plugin before 7.0.0: output_dtype must be float16, bfloat16 or int8",
    "fp32-rounded": "an op that dequantises the accumulator in fp32 before the int32 cast: exact "
                    "only below 2**24",
}


def _int32_output() -> str:
    mode = os.environ.get("TESTBED_QMM_INT32", "exact")
    if mode not in INT32_OUTPUT:
        raise ValueError(f"TESTBED_QMM_INT32: unknown mode {mode!r}; known: {sorted(INT32_OUTPUT)}")
    return mode


def _corruptions() -> frozenset:
    names = {n.strip() for n in os.environ.get("TESTBED_QMM_CORRUPT", "").split(",") if n.strip()}
    unknown = sorted(names - set(CORRUPTIONS))
    if unknown:
        raise ValueError(
            f"TESTBED_QMM_CORRUPT: unknown corruption(s) {unknown}; known: {sorted(CORRUPTIONS)}"
        )
    return frozenset(names)


def _contiguous_read(t: torch.Tensor, offset: int) -> torch.Tensor:
    """``t``'s shape read row-major from its storage at ``offset`` (a defective kernel's view)."""
    strides, step = [], 1
    for size in reversed(t.shape):
        strides.append(step)
        step *= size
    return torch.as_strided(t, t.shape, tuple(reversed(strides)), offset)


def _dtype_arg(value, op, name):
    if value is None or isinstance(value, torch.dtype):
        return value
    if isinstance(value, int) and value in _DTYPE_CODES:
        return _DTYPE_CODES[value]
    raise _testbed.reject(op, f"{name} must be a torch.dtype, got {value!r}")


def _same_npu(op: str, tensors: dict) -> int:
    """All given tensors on one npu device; returns its index."""
    index = None
    for name, t in tensors.items():
        if t is None:
            continue
        if not isinstance(t, torch.Tensor):
            raise _testbed.reject(op, f"{name} must be a Tensor, got {type(t).__name__}")
        if not npu_device.is_npu_tensor(t):
            raise _testbed.reject(
                op,
                f"expected all tensors to be on the same npu device, but {name} is on {t.device}",
            )
        if index is None:
            index = t.device.index
        elif t.device.index != index:
            raise _testbed.reject(
                op, f"expected all tensors to be on the same npu device, found npu:{index} and {t.device} ({name})"
            )
    return index


def _out(t: torch.Tensor, index: int) -> torch.Tensor:
    return npu_device.wrap(t, index)


def _empty(shape, dtype, index):
    return _out(torch.empty(shape, dtype=dtype), index)


# --------------------------------------------------------------------------- dynamic quant


def npu_dynamic_quant(input, *, smooth_scales=None, group_index=None, dst_type=None, quant_mode="pertoken",
                      dst_type_max=0.0):
    """Per-row symmetric int8 quantisation: (y int8 like input, scale fp32 input.shape[:-1]).

    The parameters are torch_npu 2.12/2.14's schema; only the per-token int8 mode is simulated.
    """
    op = _DYN
    if quant_mode != "pertoken" or dst_type_max != 0.0:
        raise _testbed.reject(op, f"quant_mode={quant_mode!r}, dst_type_max={dst_type_max!r} are not "
                                  "supported by this testbed")
    index = _same_npu(op, {"input": input, "smooth_scales": smooth_scales, "group_index": group_index})
    if input.dtype not in _FLOAT_OUT:
        raise _testbed.reject(op, f"input dtype must be float16 or bfloat16, got {input.dtype}")
    if input.dim() < 2:
        raise _testbed.reject(op, f"input must have more than 1 dimension, got shape {tuple(input.shape)}")
    if input.numel() == 0:
        raise _testbed.reject(op, f"empty input is not supported, got shape {tuple(input.shape)}")
    if group_index is not None:
        raise _testbed.reject(op, "group_index (MoE smooth groups) is not supported by this testbed")
    dst = _dtype_arg(dst_type, op, "dst_type")
    if dst not in (None, torch.int8):
        raise _testbed.reject(op, f"dst_type must be None or torch.int8, got {dst}")
    k = input.shape[-1]
    if smooth_scales is not None:
        if smooth_scales.dim() != 1 or smooth_scales.shape[0] != k:
            raise _testbed.reject(
                op, f"smooth_scales must have shape ({k},), got {tuple(smooth_scales.shape)}"
            )
        if smooth_scales.dtype != input.dtype:
            raise _testbed.reject(
                op, f"smooth_scales dtype {smooth_scales.dtype} must match input dtype {input.dtype}"
            )

    tensors = {"input": input, "smooth_scales": smooth_scales}
    _testbed.record(op, tensors, {"dst_type": dst})
    if _testbed.is_zero_cost():
        return _empty(input.shape, torch.int8, index), _empty(input.shape[:-1], torch.float32, index)

    defects = _corruptions()
    with torch.no_grad():
        x = npu_device.unwrap(input)
        if "dyn_strides_ignored" in defects:
            x = _contiguous_read(x, x.storage_offset())
        if "dyn_offset_ignored" in defects:
            x = torch.as_strided(x, x.shape, x.stride(), 0)
        xf = x.float()
        if smooth_scales is not None:
            xf = xf * npu_device.unwrap(smooth_scales).float()
        inv = 127.0 / xf.abs().amax(dim=-1, keepdim=True)  # inf for an all-zero row
        rounding = torch.trunc if "dyn_round_toward_zero" in defects else torch.round
        q = rounding(xf * inv)  # round half to even; 0 * inf -> NaN -> 0 below
        q = torch.nan_to_num(q, nan=0.0).clamp_(-127, 127).to(torch.int8)
        scale = torch.reciprocal(inv).squeeze(-1)  # 0 for an all-zero row
        if "zero_row_nan" in defects:
            scale = torch.where(torch.isinf(inv.squeeze(-1)), torch.nan, scale)
    return _out(q.contiguous(), index), _out(scale.contiguous(), index)


# --------------------------------------------------------------------------- quant matmul


def _max_dim() -> int:
    return int(os.environ.get("TESTBED_QMM_MAX_DIM", "65535"))


def _x2_layout(x2: torch.Tensor) -> str:
    if getattr(x2, "_testbed_npu_format", None) == 29:
        return "nz"
    if x2.is_contiguous():
        return "contiguous"
    if x2.transpose(-1, -2).is_contiguous():
        return "transposed"  # aclnn reads swapped strides directly: no copy
    return "copied"  # the real op makes a contiguous copy first


def _decode_int64_scale(scale: torch.Tensor) -> torch.Tensor:
    # npu_trans_quant_param packs the fp32 bits into the low 32 bits.
    low = (scale & 0xFFFFFFFF).to(torch.int64)
    low = torch.where(low >= 2**31, low - 2**32, low).to(torch.int32)
    return low.view(torch.float32)


def _exact_int_matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Exact int8 x int8 product, as float64 (the device accumulates in int32).

    fp32 GEMMs are exact while |partial sums| <= 2**24: chunks of K<=1024 keep
    1024*128*128 = 2**24; chunks are summed in float64 (exact below 2**53).
    """
    k = a.shape[-1]
    step = 1024
    acc = None
    for start in range(0, k, step):
        part = torch.matmul(a[..., start : start + step].float(), b[..., start : start + step, :].float())
        acc = part.double() if acc is None else acc + part.double()
    return acc


def npu_quant_matmul(
    x1,
    x2,
    scale,
    *,
    offset=None,
    pertoken_scale=None,
    bias=None,
    output_dtype=None,
    x1_dtype=None,
    x2_dtype=None,
    pertoken_scale_dtype=None,
    scale_dtype=None,
    group_sizes=None,
    y_scale=None,
):
    """int8 x1 (.., m, k) @ int8 x2 (.., k, n), dequantised in fp32, one RNE cast.

    The parameters are torch_npu 2.12/2.14's schema; those after ``output_dtype``
    (other input formats, grouped scales) are not simulated.
    """
    op = _QMM
    unsimulated = {"x1_dtype": x1_dtype, "x2_dtype": x2_dtype, "pertoken_scale_dtype": pertoken_scale_dtype,
                   "scale_dtype": scale_dtype, "group_sizes": group_sizes, "y_scale": y_scale}
    for key, value in unsimulated.items():
        if value is not None:
            raise _testbed.reject(op, f"{key} is not supported by this testbed (got {value!r})")
    tensors = {
        "x1": x1,
        "x2": x2,
        "scale": scale,
        "offset": offset,
        "pertoken_scale": pertoken_scale,
        "bias": bias,
    }
    index = _same_npu(op, tensors)
    out_dtype = _dtype_arg(output_dtype, op, "output_dtype") or torch.int8

    # dtypes
    if x1.dtype != torch.int8 or x2.dtype != torch.int8:
        raise _testbed.reject(op, f"x1 and x2 must be int8, got {x1.dtype} and {x2.dtype}")
    int32_mode = _int32_output()
    if int32_mode == "refused" and out_dtype not in (torch.float16, torch.bfloat16, torch.int8):
        raise _testbed.reject(op, f"output_dtype must be float16, bfloat16 or int8, got {out_dtype}")
    if out_dtype not in (torch.float16, torch.bfloat16, torch.int8, torch.int32):
        raise _testbed.reject(op, f"output_dtype must be float16, bfloat16, int8 or int32, got {out_dtype}")
    # shapes
    if not (2 <= x1.dim() <= 6 and 2 <= x2.dim() <= 6):
        raise _testbed.reject(
            op, f"x1 and x2 must have 2 to 6 dimensions, got {x1.dim()} and {x2.dim()}"
        )
    m, k = x1.shape[-2], x1.shape[-1]
    k2, n = x2.shape[-2], x2.shape[-1]
    if k != k2:
        raise _testbed.reject(
            op, f"k of x1 {tuple(x1.shape)} and x2 {tuple(x2.shape)} must match ({k} != {k2})"
        )
    if m == 0 or k == 0 or n == 0:
        raise _testbed.reject(op, f"empty matrices are not supported: m={m}, k={k}, n={n}")
    limit = _max_dim()
    if k > limit or n > limit:
        raise _testbed.reject(op, f"the last dimensions of x1 ({k}) and x2 ({n}) must be <= {limit}")
    try:
        torch.broadcast_shapes(x1.shape[:-2], x2.shape[:-2])
    except RuntimeError:
        raise _testbed.reject(
            op, f"batch dimensions of x1 {tuple(x1.shape)} and x2 {tuple(x2.shape)} do not broadcast"
        ) from None
    # scale
    if scale.dim() != 1 or scale.numel() not in (1, n):
        raise _testbed.reject(op, f"scale must be 1-D with 1 or n={n} elements, got shape {tuple(scale.shape)}")
    if scale.dtype not in (torch.float32, torch.bfloat16, torch.int64):
        raise _testbed.reject(op, f"scale dtype must be float32, bfloat16 or int64, got {scale.dtype}")
    # pertoken
    if pertoken_scale is not None:
        if x1.dim() != 2:
            raise _testbed.reject(
                op,
                f"pertoken_scale requires a 2-D x1 (got {tuple(x1.shape)}); flatten x1 first, "
                "a batched x1 would share one vector across the batch (vllm-ascend#3257)",
            )
        if pertoken_scale.dtype != torch.float32:
            raise _testbed.reject(op, f"pertoken_scale must be float32, got {pertoken_scale.dtype}")
        if pertoken_scale.dim() != 1 or pertoken_scale.shape[0] != m:
            raise _testbed.reject(
                op, f"pertoken_scale must have shape ({m},), got {tuple(pertoken_scale.shape)}"
            )
        if scale.dtype == torch.int64:
            raise _testbed.reject(op, "an int64 scale cannot be combined with pertoken_scale")
        if offset is not None:
            raise _testbed.reject(op, "offset cannot be combined with pertoken_scale")
        if out_dtype not in _FLOAT_OUT:
            raise _testbed.reject(op, f"pertoken_scale requires float16 or bfloat16 output, got {out_dtype}")
        if out_dtype == torch.float16 and scale.dtype != torch.float32:
            raise _testbed.reject(
                op, f"float16 output with pertoken_scale requires a float32 scale, got {scale.dtype}"
            )
    # dtype combinations of the op docs (7.0.0 on): a bf16 bias needs bf16 output, fp16 fp16
    if out_dtype == torch.bfloat16 and scale.dtype not in (torch.float32, torch.bfloat16):
        raise _testbed.reject(op, f"bfloat16 output requires a float32 or bfloat16 scale, got {scale.dtype}")
    if out_dtype == torch.float16 and scale.dtype == torch.bfloat16:
        raise _testbed.reject(op, "float16 output does not accept a bfloat16 scale")
    if out_dtype == torch.int8 and scale.dtype == torch.bfloat16:
        raise _testbed.reject(op, "int8 output requires a float32 or int64 scale")
    if out_dtype == torch.int32 and scale.dtype == torch.int64:
        raise _testbed.reject(op, "int32 output requires a float32 or bfloat16 scale")
    if offset is not None:
        if out_dtype != torch.int8:
            raise _testbed.reject(op, f"offset is only supported with int8 output, got {out_dtype}")
        if offset.dtype != torch.float32 or offset.dim() != 1 or offset.numel() not in (1, n):
            raise _testbed.reject(op, f"offset must be float32 of shape (1,) or ({n},)")
    # bias
    if bias is not None:
        allowed = {
            torch.bfloat16: (torch.int32, torch.bfloat16, torch.float32),
            torch.float16: (torch.int32, torch.float16, torch.float32)
            if pertoken_scale is not None
            else (torch.int32,),
            torch.int8: (torch.int32,),
            torch.int32: (torch.int32,),
        }[out_dtype]
        if bias.dtype not in allowed:
            names = ", ".join(str(d).replace("torch.", "") for d in allowed)
            raise _testbed.reject(
                op, f"a {bias.dtype} bias is not supported with {out_dtype} output (allowed: {names})"
            )
        batch = x1.shape[:-2] if x1.dim() > 2 else ()
        ok_shapes = {(n,), (1, n)}
        if batch:
            ok_shapes.add((*batch, 1, n))
        if tuple(bias.shape) not in ok_shapes:
            raise _testbed.reject(op, f"bias must have shape ({n},) or (1, {n}), got {tuple(bias.shape)}")

    out_shape = (*torch.broadcast_shapes(x1.shape[:-2], x2.shape[:-2]), m, n)
    options = {"output_dtype": out_dtype}
    notes = {"x2_layout": _x2_layout(x2)}
    _testbed.record(op, tensors, options, notes)
    if _testbed.is_zero_cost():
        return _empty(out_shape, out_dtype, index)

    u = npu_device.unwrap
    defects = _corruptions()
    with torch.no_grad():
        a, b = u(x1), u(x2)
        if "x2_strides_ignored" in defects:
            b = _contiguous_read(b, b.storage_offset())
        if "k_tail" in defects and k % _ALIGN:
            a, b = a[..., : k - k % _ALIGN], b[..., : k - k % _ALIGN, :]
        acc = _exact_int_matmul(a, b)
        if bias is not None and bias.dtype == torch.int32:
            acc = acc + u(bias).double()
        s = u(scale)
        s = _decode_int64_scale(s) if s.dtype == torch.int64 else s.float()
        if out_dtype == torch.int32 and int32_mode == "exact":
            # the accumulator itself, scaled in float64: bit exact with a unit scale
            exact = acc * s.double()
            return _out(torch.round(exact).clamp_(*_INT32_RANGE).to(torch.int32).contiguous(), index)
        out = acc.float()  # int32 -> fp32 first, then the scale: the kernel's order
        if "per_channel_scale_first" in defects and s.numel() > 1:
            s = s[:1]
        out = out * s
        if "scale_twice" in defects:
            out = out * s
        if pertoken_scale is not None and "pertoken_dropped" not in defects:
            p = u(pertoken_scale)
            if "m_tile" in defects and m > _M_TILE:
                rows = torch.arange(m)
                p = p[torch.where(rows >= _M_TILE, rows - _M_TILE, rows)]
            out = out * p.unsqueeze(-1)
        if bias is not None and bias.dtype != torch.int32 and "bias_ignored" not in defects:
            float_bias = u(bias)
            if "bf16_bias_as_fp16" in defects and float_bias.dtype == torch.bfloat16:
                float_bias = float_bias.view(torch.float16)
            if "fp16_bias_as_bf16" in defects and float_bias.dtype == torch.float16:
                float_bias = float_bias.view(torch.bfloat16)
            out = out + float_bias.float()
        if "odd_m_tail" in defects and m > 1 and m % 2:
            out[..., m - 1, :] = out[..., m - 2, :]
        if "n_tail" in defects and n % _ALIGN:
            out[..., n - n % _ALIGN :] = 0
        if "fp16_zeros" in defects and out_dtype == torch.float16:
            out = torch.zeros_like(out)
        if offset is not None:
            out = out + u(offset)
        if out_dtype in _FLOAT_OUT:
            out = out.to(out_dtype)  # one round-to-nearest-even cast
        else:
            lo, hi = _INT8_RANGE if out_dtype == torch.int8 else _INT32_RANGE
            out = torch.round(out.double()).clamp_(lo, hi).to(out_dtype)
    return _out(out.contiguous(), index)


# --------------------------------------------------------------------------- formats


def npu_format_cast(input, acl_format, *, customize_dtype=None, input_dtype=None):
    """Returns ``input`` itself, remembering the format (29 = FRACTAL_NZ)."""
    _same_npu("npu_format_cast", {"input": input})
    if customize_dtype is not None or input_dtype is not None:
        raise _testbed.reject("npu_format_cast", "customize_dtype and input_dtype are not supported by this testbed")
    fmt = int(acl_format)
    input._testbed_npu_format = fmt
    _testbed.format_casts.append((npu_device.storage_ptr(input), tuple(input.shape), fmt))
    _testbed.counters["npu_format_cast"] += 1
    return input


def get_npu_format(input) -> int:
    return getattr(input, "_testbed_npu_format", 2)  # 2 = ND


# --------------------------------------------------------------------------- RoPE / RMSNorm

_ROT = "npu_rotary_mul"
_RMS = "npu_rms_norm"
_ROPE_FLOATS = (torch.float16, torch.bfloat16, torch.float32)


def npu_rotary_mul(input, r1, r2, rotary_mode="half", rotate=None):
    """``r1 * input + r2 * rotate(input)`` as op-plugin documents it (7.x docs, Atlas A2/A3).

    "half": rotate(x) = cat(-x2, x1) of the two halves of the last dim;
    "interleave": rotate(x) = (-x[1::2], x[0::2]) interleaved. input, r1, r2
    4-D of one float dtype; r1/r2 broadcast to input; D even and < 896;
    B, N < 1000, and for "interleave" B * N < 1000 (N: heads, dim 2 when r
    is 1S1D/BS1D, else dim 1). Computed
    in float32, one rounding to input's dtype.
    """
    op = _ROT
    index = _same_npu(op, {"input": input, "r1": r1, "r2": r2, "rotate": rotate})
    if rotate is not None:
        raise _testbed.reject(op, "rotate is not supported by this testbed")
    if rotary_mode not in ("half", "interleave"):
        raise _testbed.reject(op, f"rotary_mode must be 'half' or 'interleave', got {rotary_mode!r}")
    for name, t in (("input", input), ("r1", r1), ("r2", r2)):
        if t.dim() != 4:
            raise _testbed.reject(op, f"{name} must be 4-D, got shape {tuple(t.shape)}")
        if t.dtype not in _ROPE_FLOATS or t.dtype != input.dtype:
            raise _testbed.reject(op, f"{name} dtype {t.dtype} must be input's float dtype {input.dtype}")
    b, d = input.shape[0], input.shape[-1]
    n = input.shape[2] if r1.shape[1] != 1 and r1.shape[2] == 1 else input.shape[1]  # BSND or BNSD
    if d % 2 or d >= 896:
        raise _testbed.reject(op, f"D must be even and < 896, got {d}")
    if b >= 1000 or n >= 1000 or (rotary_mode == "interleave" and b * n >= 1000):
        raise _testbed.reject(op, f"B, N (and for interleave B*N) must be < 1000, got {tuple(input.shape)}")
    try:
        torch.broadcast_shapes(r1.shape, r2.shape, input.shape)
    except RuntimeError:
        raise _testbed.reject(op, f"r1 {tuple(r1.shape)} / r2 {tuple(r2.shape)} do not broadcast to "
                                  f"input {tuple(input.shape)}") from None
    if torch.broadcast_shapes(r1.shape, r2.shape, input.shape) != input.shape:
        raise _testbed.reject(op, "r1/r2 must broadcast to input's shape")
    _testbed.record(op, {"input": input, "r1": r1, "r2": r2}, {"rotary_mode": rotary_mode})
    if _testbed.is_zero_cost():
        return _empty(input.shape, input.dtype, index)
    x = npu_device.unwrap(input).float()
    c, s = npu_device.unwrap(r1).float(), npu_device.unwrap(r2).float()
    if rotary_mode == "half":
        x1, x2 = x.chunk(2, dim=-1)
        partner = torch.cat((-x2, x1), dim=-1)
    else:
        partner = torch.stack((-x[..., 1::2], x[..., 0::2]), dim=-1).flatten(-2)
    return _out((c * x + s * partner).to(input.dtype), index)


def npu_rms_norm(input, gamma, epsilon=1e-06):
    """``(input * rsqrt(mean(input**2, -1) + epsilon) * gamma, rstd)`` (torch_npu docs).

    input float16/bfloat16/float32, gamma of input's dtype broadcasting over
    input's last dims; computed in float32, y rounded once to input's dtype;
    rstd float32 of input's shape with the normalized dims kept as 1.
    """
    op = _RMS
    index = _same_npu(op, {"input": input, "gamma": gamma})
    if input.dtype not in _ROPE_FLOATS:
        raise _testbed.reject(op, f"input dtype must be float16, bfloat16 or float32, got {input.dtype}")
    if gamma.dtype != input.dtype:
        raise _testbed.reject(op, f"gamma dtype {gamma.dtype} must be input's dtype {input.dtype}")
    if gamma.dim() < 1 or gamma.dim() > input.dim() or tuple(input.shape[-gamma.dim():]) != tuple(gamma.shape):
        raise _testbed.reject(op, f"gamma {tuple(gamma.shape)} must match input's last dims {tuple(input.shape)}")
    _testbed.record(op, {"input": input, "gamma": gamma}, {"epsilon": epsilon})
    dims = tuple(range(input.dim() - gamma.dim(), input.dim()))
    rstd_shape = tuple(1 if i in dims else s for i, s in enumerate(input.shape))
    if _testbed.is_zero_cost():
        return _empty(input.shape, input.dtype, index), _empty(rstd_shape, torch.float32, index)
    x = npu_device.unwrap(input).float()
    rstd = torch.rsqrt(x.pow(2).mean(dim=dims, keepdim=True) + epsilon)
    y = (x * rstd * npu_device.unwrap(gamma).float()).to(input.dtype)
    return _out(y, index), _out(rstd, index)


# --------------------------------------------------------------------------- SwiGLU / GroupNorm + SiLU

_SWIGLU = "npu_swiglu"
_GN_SILU = "npu_group_norm_silu"


def npu_swiglu(input, dim=-1):
    """``swish(A) * B`` of the two halves A (first), B (second) of ``input`` along ``dim``
    (torch_npu docs: 1-8 dims, fp32/fp16/bf16, the dim even, no empty or non-contiguous
    tensor; the output has input's dtype). The docs state no internal precision: the bed
    computes in float32 with one rounding to input's dtype, as the other fused ops do.
    """
    op = _SWIGLU
    index = _same_npu(op, {"input": input})
    if input.dtype not in _ROPE_FLOATS:
        raise _testbed.reject(op, f"input dtype must be float32, float16 or bfloat16, got {input.dtype}")
    if not 1 <= input.dim() <= 8:
        raise _testbed.reject(op, f"input must have 1 to 8 dimensions, got shape {tuple(input.shape)}")
    if not -input.dim() <= dim < input.dim():
        raise _testbed.reject(op, f"dim {dim} out of range for shape {tuple(input.shape)}")
    if input.numel() == 0:
        raise _testbed.reject(op, "empty input is not supported")
    if not input.is_contiguous():
        raise _testbed.reject(op, "non-contiguous input is not supported")
    if input.shape[dim] % 2:
        raise _testbed.reject(op, f"input's dim {dim} ({input.shape[dim]}) must be even")
    _testbed.record(op, {"input": input}, {"dim": dim})
    out_shape = list(input.shape)
    out_shape[dim] //= 2
    if _testbed.is_zero_cost():
        return _empty(out_shape, input.dtype, index)
    a, b = npu_device.unwrap(input).float().chunk(2, dim=dim)
    return _out((torch.nn.functional.silu(a) * b).to(input.dtype), index)


def npu_group_norm_silu(input, weight, bias, group, eps=0.00001):
    """``silu(group_norm(input, group, weight, bias, eps))`` and the group mean and rstd
    (torch_npu docs: input [N, C, *] fp16/bf16/fp32, C divisible by group, weight/bias (C,)
    of input's dtype or None). Computed in float32, y rounded once to input's dtype;
    mean and rstd (N, group) in input's dtype.
    """
    op = _GN_SILU
    index = _same_npu(op, {"input": input, "weight": weight, "bias": bias})
    if input.dtype not in _ROPE_FLOATS:
        raise _testbed.reject(op, f"input dtype must be float32, float16 or bfloat16, got {input.dtype}")
    if input.dim() < 2:
        raise _testbed.reject(op, f"input must be [N, C, *], got shape {tuple(input.shape)}")
    n, c = input.shape[0], input.shape[1]
    if group <= 0 or c % group:
        raise _testbed.reject(op, f"C ({c}) must be divisible by group ({group})")
    for name, t in (("weight", weight), ("bias", bias)):
        if t is not None and (t.dtype != input.dtype or tuple(t.shape) != (c,)):
            raise _testbed.reject(op, f"{name} must be ({c},) of input's dtype, got {tuple(t.shape)} {t.dtype}")
    if input.numel() == 0:
        raise _testbed.reject(op, "empty input is not supported")
    _testbed.record(op, {"input": input, "weight": weight, "bias": bias}, {"group": group, "eps": eps})
    if _testbed.is_zero_cost():
        return (_empty(input.shape, input.dtype, index), _empty((n, group), input.dtype, index),
                _empty((n, group), input.dtype, index))
    x = npu_device.unwrap(input).float()
    grouped = x.reshape(n, group, -1)
    mean = grouped.mean(dim=-1)
    rstd = torch.rsqrt(grouped.var(dim=-1, unbiased=False) + eps)
    y = ((grouped - mean.unsqueeze(-1)) * rstd.unsqueeze(-1)).reshape(x.shape)
    shape = (1, c) + (1,) * (x.dim() - 2)
    if weight is not None:
        y = y * npu_device.unwrap(weight).float().reshape(shape)
    if bias is not None:
        y = y + npu_device.unwrap(bias).float().reshape(shape)
    y = torch.nn.functional.silu(y)
    return (_out(y.to(input.dtype), index), _out(mean.to(input.dtype), index), _out(rstd.to(input.dtype), index))
