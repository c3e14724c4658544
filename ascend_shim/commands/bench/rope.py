"""``bench``'s RoPE table: comfy-kitchen's eager RoPE vs the shim's fused one, side by side.

Two model calls per step of a sampling run: Flux's ``apply_rope`` (24 heads
of 128, interleaved pairs) and MiniMax-H3's ``rms_rope_split_half`` (RMS
norm, then the split-half rotation of the first 64 channels). Each is timed
as kitchen's eager computes it and as the shim's ``ascend_shim_rope`` backend
does on ``npu_rotary_mul`` / ``npu_rms_norm``, with the largest difference
between the two. Nothing changes by default: the table is for a user to
measure on their own 910B and paste.
"""

from typing import Any, Callable, Dict, List, Tuple

HEAD_DIM = 128
# (label, function, heads, split-half layout, rms, rot_dim)
CASES = (("Flux apply_rope", "apply_rope", 24, False, False, 0),
         ("MiniMax-H3 rms_rope_split_half", "rms_rope_split_half", 16, True, True, HEAD_DIM // 2))


def _freqs_cis(torch: Any, positions: int, pairs: int) -> Any:
    """ComfyUI's rotary matrices ``[1, 1, L, pairs, 2, 2]``, float32."""
    angle = torch.rand(1, positions, pairs) * 100
    cos, sin = torch.cos(angle), torch.sin(angle)
    return torch.stack([cos, -sin, sin, cos], dim=-1).reshape(1, positions, pairs, 2, 2).unsqueeze(1)


def _call(torch: Any, device: Any, tokens: int, heads: int, rms: bool, rot_dim: int) -> Dict[str, Any]:
    pairs = (rot_dim or HEAD_DIM) // 2
    q = torch.randn(1, heads, tokens, HEAD_DIM, dtype=torch.bfloat16).to(device)
    k = torch.randn(1, heads, tokens, HEAD_DIM, dtype=torch.bfloat16).to(device)
    call: Dict[str, Any] = {"freqs_cis": _freqs_cis(torch, tokens, pairs).to(device)}
    if not rms:
        return dict(call, xq=q, xk=k)
    scale = (torch.rand(HEAD_DIM) + 0.5).to(torch.bfloat16).to(device)
    return dict(call, q=q, k=k, q_scale=scale, k_scale=scale, rot_dim=rot_dim)


def _max_diff(torch: Any, got: Any, want: Any) -> float:
    pairs = zip(got if isinstance(got, tuple) else (got,), want if isinstance(want, tuple) else (want,))
    return max(float((g.float() - w.float()).abs().max().cpu()) for g, w in pairs)


def rope_rows(torch: Any, device: Any, ops: Any, tokens: int,
              median_ms: Callable[[Callable[[], Any]], float]) -> Tuple[List[Dict[str, Any]], str]:
    """``(rows, why none)``: each case timed eager and fused; empty rows with the reason where
    this comfy-kitchen or torch_npu cannot run the comparison."""
    try:
        import comfy_kitchen as ck
    except Exception as exc:
        return [], "comfy-kitchen does not import (%s: %s)" % (type(exc).__name__, exc)
    from ascend_shim.kitchen import registry_access, rope

    registry = registry_access.KitchenRegistry(ck.registry)
    backend = rope.RopeBackend(ops, registry, False, None, registry_access.eager_trims_rope_freqs())
    if backend.probe.problem:
        return [], "no fused RoPE on this torch_npu: %s" % backend.probe.problem
    rows: List[Dict[str, Any]] = []
    for label, function, heads, _split, rms, rot_dim in CASES:
        eager = registry.implementation(function, rope.EAGER) if hasattr(ck, function) else None
        if eager is None:
            continue
        call = _call(torch, device, tokens, heads, rms, rot_dim)
        try:
            bound = backend.bind(function, (), call)
        except TypeError:  # a release whose function has no rot_dim
            call.pop("rot_dim", None)
            bound = backend.bind(function, (), call)
        reason = rope.decline(function, bound, backend.probe, backend.trims)
        row: Dict[str, Any] = {"case": label, "tokens": tokens, "heads": heads}
        row["eager_ms"] = median_ms(lambda: eager(**call))
        if reason:
            row["fused"] = "declined: %s" % reason
        else:
            row["fused_ms"] = median_ms(lambda: backend.fused(function, bound))
            row["max_abs_diff"] = _max_diff(torch, backend.fused(function, bound), eager(**call))
        rows.append(row)
    return rows, "" if rows else "this comfy-kitchen has none of the RoPE functions timed here"


def print_rope_table(rows: List[Dict[str, Any]], why_none: str, emulated: Any) -> None:
    print("")
    if not rows:
        print("RoPE, eager vs fused: not timed (%s)" % why_none)
        return
    print("RoPE, comfy-kitchen eager vs fused npu_rotary_mul, bf16, ms%s:" % (" (emulated)" if emulated else ""))
    print("| case | tokens | heads | eager ms | fused ms | speed-up | max abs diff |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        if "fused_ms" in r:
            print("| %s | %d | %d | %.3f | %.3f | %.2fx | %.3g |" % (
                r["case"], r["tokens"], r["heads"], r["eager_ms"], r["fused_ms"],
                r["eager_ms"] / r["fused_ms"], r["max_abs_diff"]))
        else:
            print("| %s | %d | %d | %.3f | %s | | |" % (r["case"], r["tokens"], r["heads"], r["eager_ms"],
                                                       r["fused"]))
