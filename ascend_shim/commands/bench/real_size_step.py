"""The seed user's MiniMax-H3 step at its real size, as one table of shapes, calls and device work.

The user's run: MiniMax-H3 INT8 at 864x480, 121 frames (15,655 packed tokens: a 256-token prompt,
414 audio rows, 14,985 video rows), ComfyUI's MiniMax-H3 text-to-video template (BasicGuider: no
negative, cfg 1), 20 steps in 161.81 s for the whole prompt on one 910B3. One sampling step is one
forward through 50 blocks of hidden 5376, 56 heads of 128, FFN 14336.

``bench --real-size`` times each row on the card; ``benchmarks/real_size.py`` counts the same step
on the simulated 910B (ComfyUI 0.30.0's own model, no data) and holds its count to this table, so
both read one set of numbers. Per call, each row lists the device kernels the shim's path runs, as
the account charges them: bytes are inputs read plus outputs written (an in-place op's target read
and written), FLOPs are 2mnk for a GEMM, 4*H*Sq*Sk*D for attention, else one per output element.
The bound of a kernel is max(FLOPs / peak, bytes / bandwidth) at the peaks below (figures third
parties quote for the 910B3; no Huawei datasheet was at hand). Left out: the patch and time
embedders, the final layer's modulation and the glue between blocks, under 0.1 % of the bound.
Stdlib only: the benchmark imports it without torch.
"""

from typing import List, NamedTuple, Tuple

USER_RUN = "MiniMax-H3 int8, 864x480, 121 frames, BasicGuider (cfg 1): 20 steps, the prompt in 161.81 s on one 910B3"
USER_STEP_SECONDS = 161.81 / 20
# the peaks the account's bound assumes: FP16/BF16 cube TFLOPS, INT8 cube TOPS, HBM TB/s
BF16_TFLOPS, INT8_TOPS, HBM_TBPS = 313.0, 626.0, 1.6
# the int8 model ComfyUI's loader puts on the card at this size (the account's count, 2026-12-03)
WEIGHTS_BYTES = 46_978_406_656
VIDEO = {"width": 864, "height": 480, "length": 121, "text_len": 256}
# The multi-card account's interconnect: one HCCS link, card to card, per direction. An Atlas 800T A2
# (8 x 910B) joins its cards in a full mesh of HCCS links, 7 per card. Huawei's own profiler rates a
# 910B (chip v4.1.0) link at 28 GB/s (``HCCS_BANDWIDTH_V4_1_0 = 28``, github.com/Ascend/msprof,
# analysis/common_func/ms_constant/number_constant.py); the 56 GB/s per link (392 GB/s per card) third
# parties quote counts both directions. A collective over P cards of that mesh drives P - 1 links per
# card: its bus bandwidth per direction (nccl-tests' busbw) is at most (P - 1) x 28.
HCCS_LINK_GB_S = 28.0
HCCS_LINKS_PER_CARD = 7
# The account's roofline bound per card and step on N cards under raylight's Ulysses split
# (benchmarks/real_size.py --cards 1,2,4,8 on v0.30.0, shim, one forward per step; 2026-12-04): the
# share of one card's step each card keeps, replicated parts (text path, embeddings, adaLN, final
# layer) and the split's own glue included. ``bench --hccl --step-seconds`` scales a measured
# one-card step by it.
PER_CARD_BOUND_S = {1: 2.43, 2: 1.30, 4: 0.66, 8: 0.34}
# Ulysses sequence parallel (issue 34): per block, q, k and v go head-sharded by one all-to-all each and
# the attention output comes back by a fourth; per forward the sequence shards are gathered once
ULYSSES_ALL_TO_ALL_PER_BLOCK = 4
ULYSSES_ALL_GATHER_PER_FORWARD = 1
CLASSES = ("attention", "quantized linears", "other linears", "convolutions", "norms", "modulation",
           "RoPE", "activation", "Ulysses glue", "elementwise glue", "other")
BF16, FP32 = 2, 4  # bytes per element


class Dims(NamedTuple):
    text: int       # packed rows per segment, in the model's order: text | audio | video
    audio: int
    video: int
    hidden: int
    heads: int
    head_dim: int
    ffn: int
    rot_dim: int    # the leading q/k channels the split-half RoPE turns
    time_dim: int   # the adaLN projection's input width
    time_rows: int  # distinct timesteps a forward modulates with (video's, audio's)
    blocks: int
    forwards: int   # per sampling step: 1 (BasicGuider); a CFG guider runs the positive and the negative

    @property
    def tokens(self) -> int:
        return self.text + self.audio + self.video

    @property
    def inner(self) -> int:
        return self.heads * self.head_dim

    @property
    def block_calls(self) -> int:
        return self.blocks * self.forwards


REAL = Dims(text=256, audio=414, video=14985, hidden=5376, heads=56, head_dim=128, ffn=14336, rot_dim=96,
            time_dim=2688, time_rows=2, blocks=50, forwards=1)
# the same rows at a size a host CPU computes in moments: a check that the kit runs, no figures
TINY = Dims(text=8, audio=8, video=48, hidden=256, heads=2, head_dim=128, ffn=512, rot_dim=96,
            time_dim=64, time_rows=2, blocks=50, forwards=1)


class Kernel(NamedTuple):
    account_class: str
    op: str
    nbytes: int
    flops: float
    int8_ops: float = 0.0


class Row(NamedTuple):
    key: str
    label: str
    shape: str
    calls: int                     # per sampling step
    kernels: Tuple[Kernel, ...]    # one call's
    in_step: bool = True           # False: another way to run a row that is in the step


# -- each row's kernels --------------------------------------------------------------------------

def _attention(d: Dims, op: str) -> Tuple[Kernel, ...]:
    qkvo = 4 * d.tokens * d.inner * BF16
    return (Kernel("attention", op, qkvo, 4.0 * d.heads * d.tokens * d.tokens * d.head_dim),)


def quant_linear_shapes(d: Dims) -> Tuple[Tuple[str, str, int, int, int], ...]:
    """(key, name, M, K, N) of each block's INT8 linear."""
    m = d.tokens
    return (("qkv", "QKV projection", m, d.hidden, 3 * d.inner), ("out", "attention out", m, d.inner, d.hidden),
            ("fc1", "MLP fc1 (gate and up)", m, d.hidden, 2 * d.ffn), ("fc2", "MLP fc2", m, d.ffn, d.hidden))


def _quant_linear(m: int, k: int, n: int) -> Tuple[Kernel, ...]:
    quant = Kernel("quantized linears", "npu_dynamic_quant", m * k * BF16 + m * k + m * FP32, m * k + m)
    # int8_tensorwise: one weight scale per layer, one activation scale per token
    matmul = Kernel("quantized linears", "npu_quant_matmul",
                    m * k + n * k + FP32 + m * FP32 + m * n * BF16, 0.0, 2.0 * m * n * k)
    return quant, matmul


def _rms_norm(rows: int, width: int, heads: int = 1) -> Kernel:
    elements = rows * heads * width
    return Kernel("norms", "npu_rms_norm", 2 * elements * BF16 + width * BF16 + rows * heads * FP32,
                  elements + rows * heads)


def _rope(d: Dims) -> Tuple[Kernel, ...]:
    """The shim's rms_rope_split_half_ on q and k (kitchen/rope.py): the coefficients once, then per
    tensor its copy made contiguous, the norm, the turned part made contiguous and rotated, both
    parts copied back into the tensor."""
    whole = d.tokens * d.heads * d.head_dim
    turned = d.tokens * d.heads * d.rot_dim
    rest = whole - turned
    coefficients = d.tokens * d.rot_dim * BF16
    per_tensor = (Kernel("RoPE", "contiguous", 2 * whole * BF16, whole),
                  _rms_norm(d.tokens, d.head_dim, d.heads),
                  Kernel("RoPE", "contiguous", 2 * turned * BF16, turned),
                  Kernel("RoPE", "npu_rotary_mul", 2 * turned * BF16 + 2 * coefficients, turned),
                  Kernel("RoPE", "copy_", 3 * turned * BF16, turned),
                  Kernel("RoPE", "copy_", 3 * rest * BF16, rest))
    build = (Kernel("RoPE", "copy_", 3 * coefficients, coefficients // BF16),
             Kernel("RoPE", "mul", 3 * coefficients + 2 * BF16, coefficients // BF16))
    return build + per_tensor + per_tensor


def segments(d: Dims) -> Tuple[int, int, int]:
    return d.text, d.audio, d.video


def _modulation(d: Dims) -> Tuple[Kernel, ...]:
    """Half a block's modulation, ComfyUI's own code: per segment ``h.mul_(1 + scale).add_(shift)``
    on the normed stream, then ``x.addcmul_(out, gate)`` into the residual."""
    row = d.hidden * BF16
    kernels: List[Kernel] = []
    for rows in segments(d):
        part = rows * d.hidden
        kernels += [Kernel("modulation", "add", 2 * row, d.hidden),
                    Kernel("modulation", "mul_", 2 * part * BF16 + row, part),
                    Kernel("modulation", "add_", 2 * part * BF16 + row, part)]
    for rows in segments(d):
        part = rows * d.hidden
        kernels.append(Kernel("modulation", "addcmul_", 3 * part * BF16 + row, part))
    return tuple(kernels)


def adaln_width(d: Dims) -> int:
    return 6 * 3 * d.hidden  # six modulation vectors for each of three modalities


def _adaln(d: Dims) -> Tuple[Kernel, ...]:
    m, k, n = d.time_rows, d.time_dim, adaln_width(d)
    return (Kernel("other linears", "addmm", (n + m * k + n * k + m * n) * BF16, 2.0 * m * n * k),)


def _cast(rows: int, width: int, account_class: str) -> Tuple[Kernel, ...]:
    return (Kernel(account_class, "_to_copy", rows * width * (BF16 + FP32), rows * width),)


def rows(d: Dims = REAL) -> List[Row]:
    """The step's rows at ``d``, in the order ``bench --real-size`` times them."""
    s, per_block = d.tokens, d.block_calls
    bnsd = "1x%dx%dx%d bf16 (BNSD)" % (d.heads, s, d.head_dim)
    table = [Row("sdpa", "attention: SDPA (torch_npu's fused path)", bnsd, per_block,
                 _attention(d, "scaled_dot_product_attention")),
             Row("fusion_attention", "attention: npu_fusion_attention called directly", bnsd, per_block,
                 _attention(d, "npu_fusion_attention"), in_step=False)]
    for key, name, m, k, n in quant_linear_shapes(d):
        table.append(Row(key, "INT8 %s: dynamic quant + quant matmul" % name, "%dx%d @ %dx%d int8" % (m, k, k, n),
                         per_block, _quant_linear(m, k, n)))
    table += [
        Row("swiglu", "SwiGLU before fc2: npu_swiglu", "%dx%d bf16" % (s, 2 * d.ffn), per_block,
            (Kernel("activation", "npu_swiglu", 3 * s * d.ffn * BF16, s * d.ffn),)),
        Row("norm", "RMSNorm, block: npu_rms_norm", "%dx%d bf16" % (s, d.hidden), 2 * per_block,
            (_rms_norm(s, d.hidden),)),
        Row("rope", "RoPE + q/k RMSNorm: the shim's rms_rope_split_half_",
            "q, k 1x%dx%dx%d bf16, rot_dim %d" % (s, d.heads, d.head_dim, d.rot_dim), per_block, _rope(d)),
        Row("modulation", "modulation: scale-shift + gated residual, 3 segments",
            "%dx%d bf16" % (s, d.hidden), 2 * per_block, _modulation(d)),
        Row("adaln", "adaLN projection: bf16 linear", "%dx%d @ %dx%d bf16" % (d.time_rows, d.time_dim, d.time_dim,
                                                                             adaln_width(d)),
            per_block, _adaln(d)),
        Row("norm_final", "RMSNorm, final layer (video rows)", "%dx%d bf16" % (d.video, d.hidden), d.forwards,
            (_rms_norm(d.video, d.hidden),)),
        Row("cast_in", "cast fp32 -> bf16 (video patch embedding)", "%dx%d" % (d.video, d.hidden), d.forwards,
            _cast(d.video, d.hidden, "elementwise glue")),
        Row("cast_out", "cast bf16 -> fp32 (final layer, video rows)", "%dx%d" % (d.video, d.hidden), d.forwards,
            _cast(d.video, d.hidden, "modulation")),
    ]
    return table


# -- the bound -----------------------------------------------------------------------------------

def kernel_seconds(kernel: Kernel) -> float:
    return max(kernel.flops / (BF16_TFLOPS * 1e12), kernel.int8_ops / (INT8_TOPS * 1e12),
               kernel.nbytes / (HBM_TBPS * 1e12))


def bound_seconds(row: Row) -> float:
    """One call's bound: each kernel's at the assumed peaks, summed."""
    return sum(kernel_seconds(k) for k in row.kernels)


def row_bytes(row: Row) -> int:
    return sum(k.nbytes for k in row.kernels)


def row_work(row: Row) -> Tuple[float, str]:
    """(operations per call, unit) where the row's bound is compute, else (bytes, "GB/s")."""
    compute = sum(max(k.flops / (BF16_TFLOPS * 1e12), k.int8_ops / (INT8_TOPS * 1e12)) for k in row.kernels)
    memory = sum(k.nbytes / (HBM_TBPS * 1e12) for k in row.kernels)
    if compute < memory:
        return float(row_bytes(row)), "GB/s"
    int8 = sum(k.int8_ops for k in row.kernels)
    return (int8, "TOPS") if int8 else (sum(k.flops for k in row.kernels), "TFLOPS")


def per_class(d: Dims = REAL) -> dict:
    """{(account class, op): [kernels, bytes]} per step of the rows in the step."""
    out: dict = {}
    for row in rows(d):
        if not row.in_step:
            continue
        for kernel in row.kernels:
            entry = out.setdefault((kernel.account_class, kernel.op), [0, 0])
            entry[0] += row.calls
            entry[1] += row.calls * kernel.nbytes
    return out


def hccs_assumed_busbw(cards: int) -> float:
    """GB/s of bus bandwidth the multi-card account assumes for a collective over ``cards`` cards."""
    return min(cards - 1, HCCS_LINKS_PER_CARD) * HCCS_LINK_GB_S
