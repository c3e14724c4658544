"""``bench --real-size``'s step rows: each row of ``real_size_step`` timed on the card at its shapes.

Each row runs what the shim runs for that part of a MiniMax-H3 block: torch's SDPA (which torch_npu
serves with its fused attention) and ``npu_fusion_attention`` called directly, the INT8 linears as
the shim's kitchen backend computes them (``npu_math.int8.npu_quant_linear``), ``npu_swiglu``,
``npu_rms_norm``, the shim's RoPE backend on ``rms_rope_split_half_``, ComfyUI's modulation chain,
the adaLN projection and the casts, all under ``inference_mode`` as ComfyUI samples. Before a row,
its memory need (the bytes its kernels touch, an upper bound of what it holds) is held against what
the card has free; a row that does not fit, or runs out of memory, says so and the next one runs.
"""

import math
from typing import Any, Callable, Dict, List, Optional, Tuple

from ascend_shim.cli import interrupt
from ascend_shim.commands.bench import real_size_step as step

EPS = 1e-5
GIB = 1024.0 ** 3


def _randn(torch: Any, shape: Tuple[int, ...], device: Any, scale: float = 1.0) -> Any:
    return (torch.randn(shape, dtype=torch.float32) * scale).to(torch.bfloat16).to(device)


def _attention(torch: Any, device: Any, ops: Any, d: step.Dims, fused_op: bool) -> Callable[[], Any]:
    shape = (1, d.heads, d.tokens, d.head_dim)
    q, k, v = (_randn(torch, shape, device) for _ in range(3))
    if not fused_op:
        return lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v)
    if getattr(ops, "npu_fusion_attention", None) is None:
        raise NotTimed("this torch_npu has no npu_fusion_attention")
    scale = 1.0 / math.sqrt(d.head_dim)
    return lambda: ops.npu_fusion_attention(q, k, v, d.heads, "BNSD", scale=scale, keep_prob=1.0)[0]


def _quant_linear(torch: Any, device: Any, ops: Any, m: int, k: int, n: int) -> Callable[[], Any]:
    from ascend_shim.npu_math import int8 as int8_math

    x = _randn(torch, (m, k), device)
    weight = torch.randint(-127, 128, (n, k), dtype=torch.int8).to(device)
    scale = torch.tensor(0.01, dtype=torch.float32).to(device)  # int8_tensorwise: one scale per layer
    return lambda: int8_math.npu_quant_linear(x, weight, scale, None, torch.bfloat16, ops)


def _rms_norm(torch: Any, device: Any, ops: Any, rows: int, width: int) -> Callable[[], Any]:
    x = _randn(torch, (rows, width), device)
    gamma = (torch.rand(width) + 0.5).to(torch.bfloat16).to(device)
    return lambda: ops.npu_rms_norm(x, gamma, EPS)[0]


def _swiglu(torch: Any, device: Any, ops: Any, d: step.Dims) -> Callable[[], Any]:
    h = _randn(torch, (d.tokens, 2 * d.ffn), device)
    return lambda: ops.npu_swiglu(h, -1)


def _rotation_table(torch: Any, d: step.Dims) -> Any:
    """MiniMax-H3's rope table [1, S, 1, rot/2, 2, 2] in bf16, as ComfyUI builds it per forward."""
    angle = torch.rand(d.tokens, d.rot_dim // 2) * 100
    c, s = torch.cos(angle), torch.sin(angle)
    return torch.stack([c, -s, s, c], dim=-1).reshape(1, d.tokens, 1, d.rot_dim // 2, 2, 2).to(torch.bfloat16)


def _rope(torch: Any, device: Any, ops: Any, d: step.Dims) -> Callable[[], Any]:
    from ascend_shim.kitchen import rope

    function = "rms_rope_split_half_"
    # q and k are views into the QKV projection's output, as in MiniMaxH3's attention
    qkv = _randn(torch, (d.tokens, 3 * d.inner), device)
    q = qkv[:, :d.inner].view(1, d.tokens, d.heads, d.head_dim)
    k = qkv[:, d.inner:2 * d.inner].view(1, d.tokens, d.heads, d.head_dim)
    weight = (torch.rand(d.head_dim) + 0.5).to(torch.bfloat16).to(device)
    call = {"q": q, "k": k, "freqs_cis": _rotation_table(torch, d).to(device), "q_scale": weight,
            "k_scale": weight, "epsilon": EPS, "rot_dim": d.rot_dim}
    # eager's in-place checks only raise eager's errors; the kernels are the backend's own
    backend = rope.RopeBackend(ops, None, False, lambda *tensors, readonly=(): None, False)
    reason = rope.decline(function, call, backend.probe, backend.trims)
    if reason:
        raise NotTimed("the shim's RoPE backend declines it: %s" % reason)
    return lambda: backend.fused(function, call)


def _modulation(torch: Any, device: Any, d: step.Dims) -> Callable[[], Any]:
    """Half a block: ComfyUI 0.30's ``_mod_scale_shift`` then ``_mod_gate`` over the three segments."""
    x, h, out = (_randn(torch, (d.tokens, d.hidden), device) for _ in range(3))
    shift, scale, gate = (_randn(torch, (3 * d.time_rows, d.hidden), device, 0.01) for _ in range(3))
    bounds, start = [], 0
    for row, rows in enumerate(step.segments(d)):
        bounds.append((start, start + rows, row))
        start += rows

    def half_block() -> Any:
        for a, b, row in bounds:
            h[a:b].mul_(1.0 + scale[row].to(h.dtype)).add_(shift[row].to(h.dtype))
        for a, b, row in bounds:
            x[a:b].addcmul_(out[a:b], gate[row].to(x.dtype))
        return x
    return half_block


def _adaln(torch: Any, device: Any, d: step.Dims) -> Callable[[], Any]:
    t = _randn(torch, (d.time_rows, d.time_dim), device)
    weight = _randn(torch, (step.adaln_width(d), d.time_dim), device, 0.02)
    bias = _randn(torch, (step.adaln_width(d),), device)
    return lambda: torch.nn.functional.linear(t, weight, bias)


def _cast(torch: Any, device: Any, d: step.Dims, to_bf16: bool) -> Callable[[], Any]:
    source = _randn(torch, (d.video, d.hidden), device)
    if to_bf16:
        source = source.float()
        return lambda: source.to(torch.bfloat16)
    return lambda: source.to(torch.float32)


class NotTimed(Exception):
    """A row this torch_npu or shim cannot run as the step does: the reason is the row's."""


def build(torch: Any, device: Any, ops: Any, d: step.Dims, key: str) -> Callable[[], Any]:
    """The call row ``key`` times, its tensors made on ``device``."""
    linears = {name: (m, k, n) for name, _, m, k, n in step.quant_linear_shapes(d)}
    if key in linears:
        return _quant_linear(torch, device, ops, *linears[key])
    builders: Dict[str, Callable[[], Callable[[], Any]]] = {
        "sdpa": lambda: _attention(torch, device, ops, d, False),
        "fusion_attention": lambda: _attention(torch, device, ops, d, True),
        "swiglu": lambda: _swiglu(torch, device, ops, d),
        "norm": lambda: _rms_norm(torch, device, ops, d.tokens, d.hidden),
        "norm_final": lambda: _rms_norm(torch, device, ops, d.video, d.hidden),
        "rope": lambda: _rope(torch, device, ops, d),
        "modulation": lambda: _modulation(torch, device, d),
        "adaln": lambda: _adaln(torch, device, d),
        "cast_in": lambda: _cast(torch, device, d, True),
        "cast_out": lambda: _cast(torch, device, d, False),
    }
    return builders[key]()


def describe(row: step.Row) -> Dict[str, Any]:
    """A row's table entry before it is timed: what the account says of one call."""
    work, unit = step.row_work(row)
    return {"key": row.key, "op class": row.label, "shape": row.shape, "calls_per_step": row.calls,
            "bound_ms": step.bound_seconds(row) * 1e3, "in_step": row.in_step, "work": work, "unit": unit,
            "needs_bytes": step.row_bytes(row)}


def finish(entry: Dict[str, Any], ms: float) -> None:
    """The measured row: ms, achieved rate, and its share of a step."""
    entry["ms"] = ms
    seconds = ms / 1e3
    scale = 1e9 if entry["unit"] == "GB/s" else 1e12
    entry["achieved"] = entry["work"] / seconds / scale if seconds > 0 else None
    entry["step_s"] = seconds * entry["calls_per_step"]


def time_rows(torch: Any, device: Any, ops: Any, d: step.Dims, median_ms: Callable[[Callable[[], Any]], float],
              free_bytes: Callable[[], Optional[int]], progress: Callable[[str], None],
              done: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """Every row timed, appended to ``done`` as it finishes (Ctrl-C leaves what was measured there)."""
    from ascend_shim.engine.npu import is_out_of_memory

    table = step.rows(d)
    for number, row in enumerate(table, 1):
        progress("step row %d/%d: %s, %s" % (number, len(table), row.label, row.shape))
        entry = describe(row)
        free = free_bytes()
        if free is not None and entry["needs_bytes"] > free:
            entry["skipped"] = "needs %.1f GiB, %.1f GiB free" % (entry["needs_bytes"] / GIB, free / GIB)
            done.append(entry)
            continue
        function: Optional[Callable[[], Any]] = None
        try:
            with torch.inference_mode():
                function = build(torch, device, ops, d, row.key)
                finish(entry, median_ms(function))
        except NotTimed as reason:
            entry["skipped"] = str(reason)
        except Exception as exc:
            if interrupt.seen():
                raise KeyboardInterrupt from exc  # Ctrl-C surfaced from inside an op
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
            entry["skipped"] = ("out of memory at this size: %s" % first[:160] if is_out_of_memory(exc)
                                else "failed: %s: %s" % (type(exc).__name__, first[:160]))
        finally:
            function = None  # the row's tensors go before the next row's are made
            empty_cache = getattr(getattr(torch, "npu", None), "empty_cache", None)
            if callable(empty_cache):
                empty_cache()
        done.append(entry)
    return done


def prediction(entries: List[Dict[str, Any]]) -> Dict[str, Any]:
    """Σ time x calls over the step's timed rows, and the same rows' bound."""
    in_step = [e for e in entries if e["in_step"]]
    timed = [e for e in in_step if "ms" in e]
    return {"predicted_s": sum(e["step_s"] for e in timed), "bound_s": sum(e["bound_ms"] * e["calls_per_step"]
                                                                          for e in in_step) / 1e3,
            "rows_timed": len(timed), "rows_in_step": len(in_step),
            "missing": [e["key"] for e in in_step if "ms" not in e]}
