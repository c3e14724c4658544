"""``bench``'s fused-op table: torch's / comfy-kitchen's eager chains vs the shim's fused kernels.

MiniMax-H3's per-block calls at the bench's token count: the block RMSNorm
(hidden 5376, bf16: torch's composite vs ``npu_rms_norm``, what the shim's
``aten::rms_norm`` kernel runs) and the MLP's SwiGLU before the INT8 down
projection (``[gate | up]`` of 2 x 14336, bf16: kitchen's eager activation
vs ``npu_swiglu``). Each is timed both ways, with the largest difference in
units in the last place. Nothing changes by default: the table is for a user
to measure on their own 910B and paste.
"""

from typing import Any, Callable, Dict, List, Tuple

HIDDEN, FFN = 5376, 14336


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
    return rows, "" if rows else "this torch_npu has neither npu_rms_norm nor npu_swiglu"


def print_fused_table(rows: List[Dict[str, Any]], why_none: str, emulated: Any) -> None:
    print("")
    if not rows:
        print("fused norms and activations: not timed (%s)" % why_none)
        return
    print("eager chains vs fused NPU ops, bf16, ms%s:" % (" (emulated)" if emulated else ""))
    print("| case | shape | eager ms | fused ms | speed-up | max ulp diff |")
    print("|---|---|---:|---:|---:|---:|")
    for r in rows:
        shape = "x".join(map(str, r["shape"]))
        if "fused_ms" in r:
            print("| %s | %s | %.3f | %.3f | %.2fx | %d |" % (r["case"], shape, r["eager_ms"], r["fused_ms"],
                                                              r["eager_ms"] / r["fused_ms"], r["max_ulps"]))
        else:
            print("| %s | %s | %.3f | %s | | |" % (r["case"], shape, r["eager_ms"], r["fused"]))
