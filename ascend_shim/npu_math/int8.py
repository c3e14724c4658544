"""INT8 linear math for the NPU, as plain functions of tensors.

Nothing here knows comfy-kitchen's registry; ``backend`` binds these to it.
The torch_npu ops are passed in (``ops``) so the same code runs on a real
910B and on the simulated device in the tests.

Scaling contract of ``npu_quant_matmul``: out = acc * scale[n] * pertoken[m]
(+ bias), in fp32, one rounding to ``output_dtype``. The scales go in *once*;
nothing multiplies the result afterwards.
"""

import torch

# x1/x2 last-dimension limit of npu_quant_matmul on the CANN releases in use
MAX_QUANT_MATMUL_DIM = 65535

QUANT_DTYPES = (torch.float16, torch.bfloat16)


def flat_weight_scale(weight_scale):
    """ComfyUI stores ``()`` or ``[N, 1]``; the op wants fp32 ``(1,)`` or ``(N,)``."""
    scale = weight_scale if weight_scale.dim() == 1 else weight_scale.reshape(-1)
    if scale.dtype != torch.float32:
        scale = scale.to(torch.float32)
    return scale


def npu_quant_linear(x2d, weight, weight_scale, bias, out_dtype, ops):
    """``x2d @ dequant(weight).T + bias`` with per-token INT8 activations on the NPU.

    x2d       [M, K] fp16/bf16
    weight    [N, K] int8, passed as its ``.t()`` view (no copy)
    bias      None or N elements of any shape (eager's ``reshape(1, -1)``),
              passed as [N] in ``out_dtype`` (valid with fp32 scales on every
              stack that supports pertoken scaling)
    Two device kernels: one dynamic quant, one quant matmul.
    """
    x_q, x_scale = ops.npu_dynamic_quant(x2d)
    if bias is not None:
        bias = flat_bias(bias, out_dtype)
    return ops.npu_quant_matmul(
        x_q,
        weight.t(),
        flat_weight_scale(weight_scale),
        pertoken_scale=x_scale if x_scale.dim() == 1 else x_scale.reshape(-1),  # (M,)
        bias=bias,
        output_dtype=out_dtype,
    )


def flat_bias(bias, dtype):
    """A bias of N elements as ``[N]`` in ``dtype``."""
    if bias.dim() != 1:
        bias = bias.reshape(-1)
    return bias if bias.dtype == dtype else bias.to(dtype)


def dequantized_linear(x, weight, weight_scale, bias, out_dtype):
    """``(x @ weight.T) * scale + bias`` as a float GEMM on the device: the fallback path.

    No activation quantization, so it is at least as accurate as the INT8
    path. The int8 weight enters the GEMM unscaled (exact in any float
    dtype) and the scale, then the bias, are applied to the fp32 result with
    one cast to ``out_dtype`` at the end, as eager scales its int32 result:
    nothing overflows or underflows where eager's arithmetic does not. The
    GEMM runs in bf16 for bf16 x (fp32's range) and in fp32 otherwise; an
    fp16 GEMM overflows on sums that int32 holds.
    """
    compute = torch.bfloat16 if x.dtype == torch.bfloat16 else torch.float32
    acc = torch.nn.functional.linear(x.to(compute), weight.to(compute))
    out = acc.to(torch.float32) * flat_weight_scale(weight_scale)
    if bias is not None:
        out = out + flat_bias(bias, torch.float32)
    return out.to(out_dtype)


def apply_residual(out, residual, residual_scale):
    """``residual + residual_scale * out``, kept in out's dtype."""
    if residual is None:
        return out
    if residual_scale is None:
        raise ValueError("residual requires residual_scale")
    return torch.addcmul(residual.to(out.dtype), out, residual_scale.to(out.dtype))


def modulate(x, modulation_scale):
    """Batch-one modulation ``x * (1 + scale)`` with one [K] row for every token."""
    k = x.shape[-1]
    if modulation_scale.numel() != k:
        raise ValueError(
            "modulation_scale must contain one batch-one row of %d values, got %d"
            % (k, modulation_scale.numel())
        )
    return x * (1.0 + modulation_scale.reshape((1,) * (x.dim() - 1) + (k,)))


def activated_width(input_act):
    """Input columns per activated column: the gated pairs halve K."""
    return 2 if input_act in ("swiglu", "situ") else 1


def is_power_of_four(value):
    return isinstance(value, int) and value >= 4 and value & (value - 1) == 0 and (
        value.bit_length() - 1
    ) % 2 == 0


# -- exact integer matmul on the device (``aten::_int_mm`` for the NPU) -------

# fp32 represents every integer below 2**24 exactly
_FP32_EXACT_LIMIT = 2 ** 24
_MAGNITUDE = {torch.int8: 128, torch.uint8: 255}


def exact_k_chunk(a_dtype, b_dtype=torch.int8):
    """Largest power-of-two K-chunk whose fp32 partial sums stay exact.

    int8 x int8: 1024 (1024 * 128 * 128 = 2**24); uint8 x int8: 512.
    """
    bound = _MAGNITUDE[a_dtype] * _MAGNITUDE[b_dtype]
    chunk = 1
    while chunk * 2 * bound <= _FP32_EXACT_LIMIT:
        chunk *= 2
    return chunk


class _Hf32Guard:
    """Keeps ``torch.npu.matmul.allow_hf32`` off while any exact GEMM runs.

    The flag is process-wide, so overlapping users share one switch: the first
    to enter saves the user's setting and turns HF32 off, the last to leave
    puts the setting back.
    """

    def __init__(self):
        import threading

        self._lock = threading.Lock()
        self._depth = 0
        self._saved = None

    @staticmethod
    def _settings():
        npu = getattr(torch, "npu", None)
        settings = getattr(npu, "matmul", None)
        return settings if hasattr(settings, "allow_hf32") else None

    def __enter__(self):
        settings = self._settings()
        with self._lock:
            if self._depth == 0 and settings is not None:
                self._saved = bool(settings.allow_hf32)
                if self._saved:
                    settings.allow_hf32 = False
            self._depth += 1
        return self

    def __exit__(self, *exc_info):
        settings = self._settings()
        with self._lock:
            self._depth -= 1
            if self._depth == 0:
                if self._saved and settings is not None:
                    settings.allow_hf32 = True
                self._saved = None
        return False


_HF32_GUARD = _Hf32Guard()


def hf32_off():
    """Context manager: fp32 GEMMs inside run in full fp32, never HF32."""
    return _HF32_GUARD


def exact_int_mm(a, b):
    """Exact ``a[M,K] @ b[K,N]`` (a int8 or uint8, b int8) -> int32 on a's device.

    fp32 GEMMs over K-chunks short enough that every partial sum is an exact
    fp32 integer (``exact_k_chunk``), HF32 off, partials added in int32.
    """
    m, k = a.shape
    n = b.shape[1]
    if m == 0 or n == 0 or k == 0:
        return torch.zeros((m, n), dtype=torch.int32, device=a.device)
    chunk = exact_k_chunk(a.dtype, b.dtype)
    a32 = a.to(torch.float32)  # M x K: small next to b, cast once
    out = None
    with hf32_off():
        for start in range(0, k, chunk):
            stop = min(start + chunk, k)
            partial = torch.mm(a32[:, start:stop], b[start:stop].to(torch.float32)).to(torch.int32)
            out = partial if out is None else out.add_(partial)
    return out


# -- exact integer matmul on the INT8 cube (``npu_quant_matmul`` int32 output) -

def dimension_spans(size: int, limit: int = MAX_QUANT_MATMUL_DIM) -> list:
    """``[(start, stop)]`` covering ``range(size)`` in the fewest pieces of at most ``limit``.

    Pieces are equal to within one, so no piece is a sliver.
    """
    if limit < 1:
        raise ValueError("limit must be positive, got %d" % limit)
    pieces = max(1, -(-size // limit))
    spans, start = [], 0
    for index in range(pieces):
        stop = start + size // pieces + (1 if index < size % pieces else 0)
        spans.append((start, stop))
        start = stop
    return spans


def quant_int_mm(a, b, ops, unit_scale, limit: int = MAX_QUANT_MATMUL_DIM):
    """Exact ``a[M,K] @ b[K,N]`` (both int8) -> int32 with ``npu_quant_matmul``.

    int32 output with a scale of ones (op-plugin 7.0.0+) is the int32
    accumulator itself. x1's last dimension (K) and x2's (N) may not exceed
    ``limit``: N is split into column blocks, K into pieces whose int32
    partials are added in int32 (each piece's |sum| < 65535 * 2**14 < 2**31,
    and the sum of pieces wraps as CPU ``_int_mm``'s int32 accumulator does).
    One op call when K and N fit.
    """
    m, k = a.shape
    n = b.shape[1]
    if m == 0 or n == 0 or k == 0:  # the op refuses empty matrices; the product is all zeros
        return torch.zeros((m, n), dtype=torch.int32, device=a.device)
    blocks: list = []
    for n0, n1 in dimension_spans(n, limit):
        acc = None
        for k0, k1 in dimension_spans(k, limit):
            x2 = b if (k1 - k0, n1 - n0) == (k, n) else b[k0:k1, n0:n1]
            x1 = a if k1 - k0 == k else a[:, k0:k1]
            part = ops.npu_quant_matmul(x1, x2, unit_scale, output_dtype=torch.int32)
            acc = part if acc is None else acc.add_(part)
        blocks.append(acc)
    return blocks[0] if len(blocks) == 1 else torch.cat(blocks, dim=1)


# The probe's K: beyond one fp32-exact chunk, so partial sums pass 2**24.
PROBE_K = 1100


def int32_probe_operands():
    """``(a [2, K], b [K, 3], want)`` on the CPU: a small product only an exact int32 path gets right.

    Column 0 of ``a @ b``: 1099 products of -128 * -128 plus 1 = 18006017, odd
    and above 2**24 (fp32 rounds it, bf16/fp16 lose it, int8 saturates).
    Column 1: -128 * 127 products plus 127, a negative odd sum of the same size.
    Column 2: small mixed values, so swapped rows or columns show. ``b`` is
    a ``.t()`` view, as comfy-kitchen passes weights. ``want`` is computed in
    int64 on the CPU, independently of ``_int_mm``.
    """
    k = PROBE_K
    a = torch.full((2, k), -128, dtype=torch.int8)
    a[0, -1] = 1
    a[1] = torch.arange(k, dtype=torch.int64).remainder(255).sub(127).to(torch.int8)
    rows = torch.empty((3, k), dtype=torch.int8)
    rows[0] = -128
    rows[0, -1] = 1
    rows[1] = 127
    rows[2] = torch.arange(k, dtype=torch.int64).remainder(7).sub(3).to(torch.int8)
    b = rows.t()
    want = (a.to(torch.int64) @ b.to(torch.int64)).to(torch.int32)
    return a, b, want
