"""The reference: what each path should give, in float64 on the CPU, from the definitions.

Nothing here imports the product: a check that shared the product's code
would agree with a bug in it.
"""

import torch


def f64(t: torch.Tensor) -> torch.Tensor:
    return t.detach().to(device="cpu", dtype=torch.float64)


def hadamard(size: int) -> torch.Tensor:
    """Normalized regular Hadamard matrix of order ``size`` (a power of four), float64."""
    h4 = torch.ones(4, 4, dtype=torch.float64) - 2 * torch.eye(4, dtype=torch.float64).flip(0)
    h = h4
    while h.shape[0] < size:
        h = torch.kron(h, h4)
    return h / size ** 0.5


def rotate(x: torch.Tensor, group: int) -> torch.Tensor:
    """``x`` rotated by the block Hadamard of ConvRot, per group of ``group`` columns."""
    shape = x.shape
    return (x.reshape(-1, shape[-1] // group, group) @ hadamard(group)).reshape(shape)


def float_linear(x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor, bias, convrot: int
                 ) -> torch.Tensor:
    """The layer: (rotated) x @ (weight * scale per row or per tensor).T + bias."""
    xf = f64(x)
    if convrot:
        xf = rotate(xf, convrot)
    scale = f64(weight_scale).reshape(-1)
    w = f64(weight) * (scale.reshape(-1, 1) if scale.numel() > 1 else scale)
    out = xf @ w.t()
    return out if bias is None else out + f64(bias)


def w4a8_weight(codes: torch.Tensor, s_rel: torch.Tensor, codebook, group: int) -> torch.Tensor:
    """The int8 weight of int4 codes: level * s_rel in fp32, round half to even, clamp to +-127.

    A level is ``code - 8`` or, with a codebook, ``codebook[code]``.
    """
    levels = codes.to(torch.float32) - 8 if codebook is None else f64(codebook).float()[codes.long()]
    n, k = codes.shape
    scaled = levels.reshape(n, -1, group) * f64(s_rel).float().unsqueeze(-1)
    return torch.round(scaled.reshape(n, k)).clamp(-127, 127).to(torch.int8)


def fp8_value(bits: torch.Tensor, exponent_bits: int, mantissa_bits: int, finite_only: bool) -> torch.Tensor:
    """float64 value of 8-bit float codes (uint8 tensor), from the bit fields alone."""
    bias = (1 << (exponent_bits - 1)) - 1
    b = bits.to(torch.int64)
    sign = torch.where((b >> 7) & 1 == 1, -1.0, 1.0).to(torch.float64)
    exponent = (b >> mantissa_bits) & ((1 << exponent_bits) - 1)
    mantissa = (b & ((1 << mantissa_bits) - 1)).to(torch.float64)
    normal = (1 + mantissa / (1 << mantissa_bits)) * torch.pow(2.0, (exponent - bias).to(torch.float64))
    subnormal = mantissa / (1 << mantissa_bits) * 2.0 ** (1 - bias)
    value = sign * torch.where(exponent == 0, subnormal, normal)
    top = exponent == (1 << exponent_bits) - 1
    if finite_only:  # e4m3fn: only S.1111.111 is NaN
        return torch.where(top & (mantissa == (1 << mantissa_bits) - 1), float("nan"), value)
    value = torch.where(top & (mantissa == 0), sign * float("inf"), value)
    return torch.where(top & (mantissa != 0), float("nan"), value)


def decoder_qk_scores(qkv: torch.Tensor, table: torch.Tensor, heads: int, dim_head: int, eps: float) -> torch.Tensor:
    """What the MiniMax-H3 video VAE decoder's attention sees of q and k: ``(heads, S, S)`` scores
    ``q . k`` per head, from ComfyUI's definition: each head's ``[q | k | v]`` in ``qkv``
    ``(S, heads * 3 * dim_head)``, q and k RMS-normed without weight, their first ``2P`` channels
    rotated split-half (pair ``(i, i + P)``) by ``table`` ``(S, P, 2, 2)``, float64."""
    x = f64(qkv).reshape(qkv.shape[0], heads, 3, dim_head)
    m = f64(table).unsqueeze(1)  # (S, 1, P, 2, 2): one table for every head
    pairs = m.shape[-3]
    out = []
    for part in (0, 1):
        v = x[:, :, part, :]
        v = v / torch.sqrt((v * v).mean(dim=-1, keepdim=True) + eps)
        a, b, rest = v[..., :pairs], v[..., pairs:2 * pairs], v[..., 2 * pairs:]
        first = m[..., 0, 0] * a + m[..., 0, 1] * b
        second = m[..., 1, 0] * a + m[..., 1, 1] * b
        out.append(torch.cat((first, second, rest), dim=-1))
    q, k = out
    return torch.einsum("shc,thc->hst", q, k)
