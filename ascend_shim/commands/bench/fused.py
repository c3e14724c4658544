"""``bench``'s fused-op table: torch's / comfy-kitchen's eager chains vs the shim's fused kernels.

MiniMax-H3's per-block calls at the bench's token count: the block RMSNorm
(hidden 5376, bf16: torch's composite vs ``npu_rms_norm``, what the shim's
``aten::rms_norm`` kernel runs) and the MLP's SwiGLU before the INT8 down
projection (``[gate | up]`` of 2 x 14336, bf16: kitchen's eager activation
vs ``npu_swiglu``); and the MiniMax-H3 video VAE decoder's q/k glue at one
tile's tokens (fp16: ComfyUI's chain of strided norms and partial rotations vs
the ``minimax_vae_fused`` patch's gather, one norm and one rotary, compared in
the patch's channel order). Each is timed both ways, with the largest
difference in units in the last place. Nothing changes by default: the table is for a user
to measure on their own 910B and paste.
"""

from typing import Any, Callable, Dict, List, Tuple

HIDDEN, FFN = 5376, 14336
# the MiniMax-H3 video VAE decoder's attention (fp16): 32 heads of 64, the first 48 channels rotated;
# one call per block and tile: a 256-pixel tile of a 7-frame latent chunk, 16 x 16 x 7 tokens + 5
VAE_HEADS, VAE_HEAD, VAE_ROT, VAE_TOKENS = 32, 64, 48, 16 * 16 * 7 + 5


def max_ulps(torch: Any, got: Any, want: Any) -> int:
    """Largest distance of two 16-bit float tensors in representable steps."""
    a, b = (t.cpu().contiguous().view(torch.int16).int() for t in (got, want))
    a, b = (torch.where(t < 0, -(t & 0x7FFF), t) for t in (a, b))
    return int((a - b).abs().max())


def fused_rows(torch: Any, device: Any, ops: Any, tokens: int,
               median_ms: Callable[[Callable[[], Any]], float]) -> Tuple[List[Dict[str, Any]], str]:
    """``(rows, why none)``: each chain timed eager and fused on ``device``."""
    from ascend_shim.aten import rms_norm
    from ascend_shim.kitchen import swiglu

    rows: List[Dict[str, Any]] = []
    x = torch.randn(tokens, HIDDEN, dtype=torch.bfloat16).to(device)
    w = (torch.rand(HIDDEN) + 0.5).to(torch.bfloat16).to(device)
    if getattr(ops, "npu_rms_norm", None) is not None:
        def eager_norm() -> Any:
            return rms_norm.composite(x, (HIDDEN,), w, 1e-5)

        def fused_norm() -> Any:
            return ops.npu_rms_norm(x, w, 1e-5)[0]

        rows.append({"case": "RMSNorm (MiniMax-H3 block)", "shape": [tokens, HIDDEN],
                     "eager_ms": median_ms(eager_norm), "fused_ms": median_ms(fused_norm),
                     "max_ulps": max_ulps(torch, fused_norm(), eager_norm())})
    if getattr(ops, "npu_swiglu", None) is not None:
        try:
            from comfy_kitchen.backends._activations import apply_input_act
        except Exception:  # a kitchen without input_act: eager's chain written out
            def apply_input_act(t: Any, act: str) -> Any:
                gate, up = t.chunk(2, dim=-1)
                return torch.nn.functional.silu(gate).mul_(up)
        h = torch.randn(tokens, 2 * FFN, dtype=torch.bfloat16).to(device)
        path = swiglu.SwigluPath(ops)

        def eager_act() -> Any:
            return apply_input_act(h, "swiglu")

        def fused_act() -> Any:
            return ops.npu_swiglu(h, -1)

        row: Dict[str, Any] = {"case": "SwiGLU before the INT8 fc2 (MiniMax-H3 MLP)", "shape": [tokens, 2 * FFN],
                               "eager_ms": median_ms(eager_act)}
        reason = path.decline(h)
        if reason:
            row["fused"] = "declined: %s" % reason
        else:
            row.update(fused_ms=median_ms(fused_act), max_ulps=max_ulps(torch, fused_act(), eager_act()))
        rows.append(row)
    if getattr(ops, "npu_rms_norm", None) is not None and getattr(ops, "npu_rotary_mul", None) is not None:
        rows.append(_decoder_qk_row(torch, device, ops, median_ms))
    return rows, "" if rows else "this torch_npu has neither npu_rms_norm nor npu_swiglu"


def _decoder_qk_row(torch: Any, device: Any, ops: Any, median_ms: Callable[[Callable[[], Any]], float]) -> Dict[str, Any]:
    """The decoder block's q/k glue: ComfyUI's chain on the card (q and k normed on their strided chunks,
    their first channels rotated out of place and written back) against the ``minimax_vae_fused``
    patch's gather, one norm and one rotary over whole heads (``vit_blocks.normed_rotated_qk``)."""
    from ascend_shim.npu_math import rope, vit_blocks

    d, rot, tokens = VAE_HEAD, VAE_ROT, VAE_TOKENS
    qkv = torch.randn(1, tokens, VAE_HEADS * 3 * d, dtype=torch.float16).to(device)
    angle = torch.rand(1, tokens, 1, rot // 2) * 6.3
    table = torch.stack([angle.cos(), -angle.sin(), angle.sin(), angle.cos()], dim=-1)
    table = table.reshape(1, tokens, 1, rot // 2, 2, 2).to(torch.float16).to(device)
    r1, r2 = rope.rotary_coefficients(table, split_half=True)
    w1, w2 = rope.rotary_coefficients(table, split_half=True, width=d)
    index = vit_blocks.qk_order(VAE_HEADS, d, rot).to(device)

    def norm(t: Any) -> Any:
        return torch.nn.functional.rms_norm(t, (d,), None, 1e-5)

    def eager() -> Any:
        q, k, _ = torch.chunk(qkv.view(1, tokens, VAE_HEADS, 3 * d), 3, dim=-1)
        q, k = norm(q), norm(k)
        for t in (q, k):
            t[..., :rot] = ops.npu_rotary_mul(t[..., :rot].contiguous(), r1, r2, "half")
        return q, k

    def fused() -> Any:
        return vit_blocks.normed_rotated_qk(qkv, index, d, norm, ops.npu_rotary_mul, w1, w2)

    order = vit_blocks.head_order(d, rot)
    (q, k), (fq, fk) = eager(), fused()
    # a rotated value near 0 is a difference of two products: its ulps say little, its distance does
    diff = max(float((f.float() - e[..., order].float()).abs().max().cpu()) for f, e in ((fq, q), (fk, k)))
    return {"case": "MiniMax-H3 VAE decoder q/k norms + RoPE (fp16)", "shape": [tokens, VAE_HEADS * 3 * d],
            "eager_ms": median_ms(eager), "fused_ms": median_ms(fused), "max_abs_diff": diff}


def print_fused_table(rows: List[Dict[str, Any]], why_none: str, emulated: Any) -> None:
    print("")
    if not rows:
        print("fused norms and activations: not timed (%s)" % why_none)
        return
    print("eager chains vs fused NPU ops, ms%s:" % (" (emulated)" if emulated else ""))
    print("| case | shape | eager ms | fused ms | speed-up | max difference |")
    print("|---|---|---:|---:|---:|---:|")
    for r in rows:
        shape = "x".join(map(str, r["shape"]))
        if "fused_ms" in r:
            diff = "%d ulp" % r["max_ulps"] if "max_ulps" in r else "%.4g abs" % r["max_abs_diff"]
            print("| %s | %s | %.3f | %.3f | %.2fx | %s |" % (r["case"], shape, r["eager_ms"], r["fused_ms"],
                                                              r["eager_ms"] / r["fused_ms"], diff))
        else:
            print("| %s | %s | %.3f | %s | | |" % (r["case"], shape, r["eager_ms"], r["fused"]))
