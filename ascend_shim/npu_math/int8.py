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
