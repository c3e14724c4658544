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

# K-chunk for exact int32 accumulation in fp32: 1024 * 127 * 128 < 2**24
EXACT_FP32_K_CHUNK = 1024

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
    bias      None or [N]; cast to ``out_dtype`` (valid with fp32 scales on
              every stack that supports pertoken scaling)
    Two device kernels: one dynamic quant, one quant matmul.
    """
    x_q, x_scale = ops.npu_dynamic_quant(x2d)
    if bias is not None and bias.dtype != out_dtype:
        bias = bias.to(out_dtype)
    return ops.npu_quant_matmul(
        x_q,
        weight.t(),
        flat_weight_scale(weight_scale),
        pertoken_scale=x_scale if x_scale.dim() == 1 else x_scale.reshape(-1),  # (M,)
        bias=bias,
        output_dtype=out_dtype,
    )


def dequantized_linear(x, weight, weight_scale, bias, out_dtype):
    """Float linear on the device with the weight dequantized: the fallback path.

    Computes in x's dtype (fp32 for other dtypes); no activation quantization,
    so it is at least as accurate as the INT8 path.
    """
    compute = x.dtype if x.dtype in (torch.float16, torch.bfloat16, torch.float32) else torch.float32
    scale = flat_weight_scale(weight_scale).to(weight.device)
    w = weight.to(torch.float32)
    w = w * (scale.reshape(-1, 1) if scale.numel() > 1 else scale)
    out = torch.nn.functional.linear(
        x.to(compute), w.to(compute), None if bias is None else bias.to(x.device, compute)
    )
    return out.to(out_dtype)


def exact_int8_mm(a, b):
    """Exact ``a[M,K] @ b[K,N]`` int8 -> int32 on any device, without ``_int_mm``.

    Each fp32 GEMM covers at most 1024 of K, so every partial sum stays below
    2**24 and is exact in fp32 whatever the summation order; the partials are
    added in int32.
    """
    m, n = a.shape[0], b.shape[1]
    out = torch.zeros((m, n), dtype=torch.int32, device=a.device)
    k = a.shape[1]
    for start in range(0, k, EXACT_FP32_K_CHUNK):
        stop = min(start + EXACT_FP32_K_CHUNK, k)
        partial = torch.matmul(a[:, start:stop].to(torch.float32), b[start:stop].to(torch.float32))
        out += partial.to(torch.int32)
    return out


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
