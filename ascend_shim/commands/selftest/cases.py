"""What selftest runs: the INT8 calls, the ``_int_mm``, W4A8 and fp8 cases, and their inputs.

Inputs are made on the CPU from a seed, then moved to the device the way
ComfyUI stores them (int8 weights, float scales, a bias in its own dtype).
"""

import dataclasses
from typing import Any, Optional

import torch

KITCHEN_ABSENT = "comfy-kitchen is not installed in this python"

# real layer shapes (M, K, N): K past 1024 puts |acc| beyond fp32's exact integers
LAYER_SHAPES = ((64, 3840, 3840), (17, 3840, 1024), (128, 1024, 3840))


@dataclasses.dataclass(frozen=True)
class Case:
    """One ``int8_linear`` call as comfy-kitchen hands it to the shim."""

    name: str
    x_shape: tuple
    n: int
    x_dtype: str = "bfloat16"
    out_dtype: str = "bfloat16"
    bias: Optional[str] = None  # dtype name of the bias given to int8_linear, or None
    scale: str = "[N,1]"  # stored weight-scale shape: "()", "[N]" or "[N,1]"
    scale_dtype: str = "float32"
    layout: str = "contiguous"  # "strided": a column slice; "offset": a batch slice
    zero_row: bool = False
    convrot: int = 0  # ConvRot group size, 0 = off
    path: str = "npu"  # "npu": the INT8 ops; "fallback": the dequantized linear


def matrix() -> tuple:
    """The INT8 calls to check: each axis of what the shim passes, on small shapes."""
    layers = tuple(Case("int8_linear M=%d K=%d N=%d" % (m, k, n), (m, k), n) for m, k, n in LAYER_SHAPES)
    return layers + (
        Case("M=1, bf16 out, no bias, scale [N,1]", (1, 64), 48),
        Case("odd M, bf16 out, bf16 bias, scale ()", (37, 80), 56, bias="bfloat16", scale="()"),
        Case("odd M, fp16 out, fp16 bias, scale [N]", (37, 80), 56, "float16", "float16", "float16", "[N]"),
        Case("fp16 out, no bias, scale [N,1]", (16, 64), 32, "float16", "float16"),
        Case("fp16 x, bf16 out, fp32 bias (passed as bf16)", (9, 64), 40, "float16", "bfloat16", "float32"),
        Case("bf16 x, fp16 out, bf16 bias (passed as fp16)", (9, 64), 40, "bfloat16", "float16", "bfloat16",
             "[N]"),
        Case("bf16 weight scale [N,1], bf16 bias", (8, 64), 32, bias="bfloat16", scale_dtype="bfloat16"),
        Case("M=1030 past the 128- to 1024-row tiles, bf16 bias", (1030, 64), 48, bias="bfloat16"),
        Case("K=104 N=40 (off the 16-grid), bf16 bias", (12, 104), 40, bias="bfloat16"),
        Case("K=97 N=45 (odd), fp16 bias", (11, 97), 45, "float16", "float16", "float16"),
        Case("3-D x [2,19,K], bf16 bias", (2, 19, 64), 48, bias="bfloat16"),
        Case("3-D x batch slice (storage offset), fp16 bias", (2, 7, 64), 40, "float16", "float16", "float16",
             layout="offset"),
        Case("2-D x column slice (row stride > K), bf16 bias", (21, 64), 48, bias="bfloat16", layout="strided"),
        Case("all-zero activation row, bf16 bias", (7, 64), 32, bias="bfloat16", zero_row=True),
        Case("ConvRot group 16, bf16 bias", (9, 64), 48, bias="bfloat16", convrot=16),
        Case("ConvRot group 256, fp16 bias", (5, 512), 40, "float16", "float16", "float16", convrot=256),
        Case("fallback: dequantized linear, bf16 bias", (13, 64), 48, bias="bfloat16", path="fallback"),
        Case("fallback: dequantized linear, fp16, fp16 bias, scale ()", (13, 64), 48, "float16", "float16",
             "float16", "()", path="fallback"),
    )


def quantize_weight(w: torch.Tensor, per_row: bool) -> tuple:
    """Symmetric int8 weight and its scale, per output row or per tensor."""
    amax = w.abs().amax(dim=1, keepdim=True) if per_row else w.abs().amax()
    scale = (amax / 127.0).clamp(min=1e-8)
    return torch.round(w / scale).clamp(-127, 127).to(torch.int8), scale


def random_bias(n: int, generator: torch.Generator) -> torch.Tensor:
    """|bias| in [0.5, 1.5) with random signs: outputs are ~1."""
    magnitude = torch.rand(n, generator=generator) + 0.5
    sign = torch.randint(0, 2, (n,), generator=generator) * 2 - 1
    return magnitude * sign


def make_inputs(case: Case, device: torch.device, seed: int) -> tuple:
    """x, weight, weight_scale, bias of ``case``, on ``device``, as ComfyUI stores them."""
    generator = torch.Generator().manual_seed(seed)
    k, n = case.x_shape[-1], case.n
    x_dtype = getattr(torch, case.x_dtype)
    if case.layout == "strided":
        wide = torch.randn(case.x_shape[0], k + 16, generator=generator).to(device, x_dtype)
        x = wide[:, 8:8 + k]
    elif case.layout == "offset":
        batch = torch.randn((case.x_shape[0] + 1,) + tuple(case.x_shape[1:]), generator=generator)
        x = batch.to(device, x_dtype)[1:]
    else:
        x = torch.randn(case.x_shape, generator=generator)
        if case.zero_row:
            x.reshape(-1, k)[min(3, x.numel() // k - 1)] = 0
        x = x.to(device, x_dtype)
    w = torch.randn(n, k, generator=generator) / k ** 0.5
    q, scale = quantize_weight(w, case.scale != "()")
    scale = scale.reshape({"()": (), "[N]": (n,), "[N,1]": (n, 1)}[case.scale])
    bias = random_bias(n, generator).to(device, getattr(torch, case.bias)) if case.bias else None
    return x, q.to(device), scale.to(device, getattr(torch, case.scale_dtype)), bias


def quantized_weight(n: int, k: int, device: torch.device) -> tuple:
    q, scale = quantize_weight(torch.randn(n, k), True)
    return q.to(device), scale.to(device)


# (name, dtype of a, M, K, N, operands): K past 1024 crosses the exact fp32 chunks;
# "extreme" makes every product -128 * -128, so each full chunk sums to exactly 2**24
INT_MM_CASES = (
    ("int8 M=17 K=2500 N=33", "int8", 17, 2500, 33, "random"),
    ("int8 M=8 K=2048 N=16, every product 2**14", "int8", 8, 2048, 16, "extreme"),
    ("uint8 x int8 M=9 K=600 N=24, mat2 a .t() view", "uint8", 9, 600, 24, "transposed"),
)


def int_mm_operands(spec: tuple, seed: int) -> tuple:
    """CPU operands of one ``INT_MM_CASES`` entry."""
    _, a_dtype, m, k, n, kind = spec
    generator = torch.Generator().manual_seed(seed)
    if kind == "extreme":
        return torch.full((m, k), -128, dtype=torch.int8), torch.full((k, n), -128, dtype=torch.int8)
    low = 0 if a_dtype == "uint8" else -128
    a = torch.randint(low, low + 256, (m, k), generator=generator, dtype=getattr(torch, a_dtype))
    if kind == "transposed":
        b = torch.randint(-128, 128, (n, k), generator=generator, dtype=torch.int8).t()
    else:
        b = torch.randint(-128, 128, (k, n), generator=generator, dtype=torch.int8)
    return a, b


# W4A8 (kitchen 0.2.27+): packed int4 codes decoded to int8 on the device, then the INT8 ops
# (name, x shape, N, codebook, ConvRot group, x/out dtype, bias dtype)
W4A8_CASES = (
    ("W4A8 uniform levels, ConvRot 16, bf16 bias", (9, 64), 48, False, 16, "bfloat16", "bfloat16"),
    ("W4A8 codebook, ConvRot 256, 3-D x, fp16 bias", (2, 5, 256), 40, True, 256, "float16", "float16"),
)
W4A8_GROUP = 16
# a symmetric non-uniform 16-level table on the int4 scale, like kitchen's Lloyd-Max codebooks
W4A8_CODEBOOK = (-7.9, -5.8, -4.4, -3.3, -2.4, -1.6, -0.9, -0.3, 0.3, 0.9, 1.6, 2.4, 3.3, 4.4, 5.8, 7.9)


def w4a8_inputs(spec: tuple, device: torch.device, seed: int) -> tuple:
    """codes [N, K] (CPU), and x, qdata, s_rel, s_channel, codebook, bias on the device."""
    from ascend_shim.npu_math import fp8 as fp8_math

    _, x_shape, n, with_codebook, _, dtype, bias_dtype = spec
    generator = torch.Generator().manual_seed(seed)
    k = x_shape[-1]
    codes = torch.randint(0, 16, (n, k), generator=generator, dtype=torch.int32)
    packed = (codes[:, 0::2] | (codes[:, 1::2] << 4)).to(torch.uint8).view(torch.int8)  # even column low
    # group scales as checkpoints store them: float8_e4m3fn, decoded on the host like the loader does
    s_rel_fp8 = (torch.rand(n, k // W4A8_GROUP, generator=generator) * 11 + 4).to(torch.float8_e4m3fn)
    s_rel = fp8_math.decode_group_scales(s_rel_fp8.view(torch.uint8))
    s_channel = torch.rand(n, generator=generator) * 0.004 + 0.001
    codebook = torch.tensor(W4A8_CODEBOOK) if with_codebook else None
    x = torch.randn(x_shape, generator=generator).to(device, getattr(torch, dtype))
    bias = random_bias(n, generator).to(device, getattr(torch, bias_dtype))
    inputs: dict[str, Any] = dict(x=x, qdata=packed.to(device), s_rel=s_rel.to(device),
                                  s_channel=s_channel.to(device), bias=bias,
                                  codebook=None if codebook is None else codebook.to(device))
    return codes, inputs


# (dtype name, exponent bits, mantissa bits, finite only)
FP8_FORMATS = (("float8_e4m3fn", 4, 3, True), ("float8_e5m2", 5, 2, False))
