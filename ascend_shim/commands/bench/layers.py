"""``bench``'s tables on the card: each layer's bf16 linear against the shim's INT8 path, the two
arithmetics of the ``_int_mm`` kernel, the sampler ops, and the INT8 weight layouts.

Layer shapes follow the real layers measured in comfy-kitchen PR #153 (Z-Image Turbo, M=8352)
plus a small M.
"""

import time
from typing import Any, Callable, Dict, List, Optional, Tuple

from ascend_shim.commands.bench.timing import GIB, capacity, device_setup, duration, median_ms, progress

LAYERS = (("attention out", 3840, 3840), ("QKV", 3840, 11520),
          ("FFN up (w1)", 3840, 10240), ("FFN down (w2)", 10240, 3840))
# (repeat, warmup, token counts) when the command line does not say
DEFAULTS = (20, 3, [8352, 256])
EMULATED_DEFAULTS = (1, 0, [256])


def layer_bytes(m: int, k: int, n: int, on_device: bool) -> int:
    """What one measurement holds at once: weight, its bf16 copy, x, x's codes, outputs."""
    weight = n * k + n * 4 + (n * k * 2 if on_device else 0)
    activations = m * k * 2 + m * k + m * 4
    outputs = m * n * 2 * (2 if on_device else 1)
    return weight + activations + outputs


def too_big(m_values: List[int], torch: Any, device: Any, emulated: Optional[str]) -> Optional[str]:
    """The line that refuses token counts the device cannot hold, or None."""
    limit, where = capacity(torch, device, emulated)
    if limit is None:
        return None
    on_device = device.type == "npu"
    need, m, layer = max((layer_bytes(m, k, n, on_device), m, name) for name, k, n in LAYERS for m in m_values)
    if need <= limit:
        return None
    return ("--m %d needs %.1f GiB for layer %s, more than the %.1f GiB %s; give smaller token counts"
            % (m, need / GIB, layer, limit / GIB, where))


def run(m_values: List[int], repeat: int, warmup: int, setup: Optional[Tuple[Any, ...]] = None,
        reason: Optional[str] = None) -> Dict[str, Any]:
    """Time every layer at every token count; ``setup``/``reason`` as ``main`` found them."""
    import torch

    from ascend_shim.npu_math import int8 as int8_math

    if setup is None:
        from ascend_shim.engine.npu import npu_reason

        reason = npu_reason()
        setup = device_setup(torch, reason)
    device, ops, sync, emulated = setup
    on_device = device.type == "npu"
    rows: List[Dict[str, Any]] = []
    total = len(LAYERS) * len(m_values)
    work_total = sum(m * k * n for _, k, n in LAYERS for m in m_values)
    work_done, started = 0, time.perf_counter()
    for name, k, n in LAYERS:
        weight = torch.randint(-127, 128, (n, k), dtype=torch.int8).to(device)
        scale = torch.rand(n, 1, dtype=torch.float32).to(device) / 100
        dequantized = (weight.float() * scale).to(torch.bfloat16) if on_device else None
        for m in m_values:
            line = "%d/%d %s M=%d K=%d N=%d" % (len(rows) + 1, total, name, m, k, n)
            if work_done:  # the time so far, per unit of work, times the work left
                left = (time.perf_counter() - started) / work_done * (work_total - work_done)
                line += ", about %s left" % duration(left)
            progress(line)
            x = torch.randn(m, k, dtype=torch.bfloat16).to(device)
            row: Dict[str, Any] = {"layer": name, "M": m, "K": k, "N": n}
            row["int8_ms"] = median_ms(lambda: int8_math.npu_quant_linear(x, weight, scale, None,
                                                                           torch.bfloat16, ops),
                                        sync, warmup, repeat)
            if dequantized is not None:
                row["bf16_ms"] = median_ms(lambda: torch.nn.functional.linear(x, dequantized), sync,
                                            warmup, repeat)
                row["speedup"] = row["bf16_ms"] / row["int8_ms"]
            rows.append(row)
            work_done += m * k * n
    if on_device:
        progress("layers done; now the _int_mm arithmetics (%d shapes)" % len(INT_MM_SHAPES))
    paths = int_mm_paths(torch, device, ops, sync, warmup, repeat, min(m_values)) if on_device else []
    sampler = sampler_ops_rows(torch, device, sync, warmup, repeat) if on_device else []
    return {"npu": on_device, "reason": reason, "emulated": emulated, "repeat": repeat,
            "warmup": warmup, "rows": rows, "int_mm": paths, "sampler_ops": sampler}


def sampler_ops_rows(torch: Any, device: Any, sync: Callable[[], Any], warmup: int,
                     repeat: int) -> List[Dict[str, Any]]:
    """uni_pc's / sa_solver's solve and lgamma: the shim's kernel on the device beside what torch_npu's
    CPU fallback does instead (to the host, the CPU kernel, back), and their largest difference."""
    from ascend_shim.aten import sampler_ops

    rows: List[Dict[str, Any]] = []
    for name, A, b in sampler_ops.sampler_systems():
        if name not in ("uni_pc R 3x3", "sa_solver vandermonde 4x4", "sa_solver vandermonde 6x6"):
            continue
        dA, db = A.to(device), b.to(device)
        rows.append({"op": "linalg.solve " + name,
                     "shim_ms": median_ms(lambda: sampler_ops.solve_ex(dA, db)[0], sync, warmup, repeat),
                     "host_ms": median_ms(lambda: torch.linalg.solve(dA.cpu(), db.cpu()).to(device), sync,
                                           warmup, repeat),
                     "max_diff": float((sampler_ops.solve_ex(dA, db)[0].cpu() - torch.linalg.solve(A, b)).abs().max())})
    x = torch.arange(1, 7, dtype=torch.float32)
    dx = x.to(device)
    rows.append({"op": "lgamma 1..6 (sa_solver)",
                 "shim_ms": median_ms(lambda: sampler_ops.lgamma(dx), sync, warmup, repeat),
                 "host_ms": median_ms(lambda: dx.cpu().lgamma().to(device), sync, warmup, repeat),
                 "max_diff": float((sampler_ops.lgamma(dx).cpu() - x.lgamma()).abs().max())})
    return rows


def _print_sampler_ops_table(rows: List[Dict[str, Any]], emulated: Optional[str]) -> None:
    print("")
    print("| sampler op | shim kernel ms | host round trip (torch_npu's fallback) ms | max |diff| vs CPU |")
    print("|---|---:|---:|---:|")
    for r in rows:
        print("| %s | %.3f | %.3f%s | %.3g |" % (r["op"], r["shim_ms"], r["host_ms"],
                                               " (emulated)" if emulated else "", r["max_diff"]))


# _int_mm (K, N) as comfy-kitchen's eager INT8 linear issues them (weight as a .t() view), at the
# smallest token count asked for
INT_MM_SHAPES = ((3840, 3840), (3840, 10240))


def int_mm_paths(torch: Any, device: Any, ops: Any, sync: Callable[[], Any], warmup: int,
                 repeat: int, m: int) -> List[Dict[str, Any]]:
    """Both arithmetics of the shim's ``_int_mm`` kernel, timed side by side, and whether they agree."""
    from ascend_shim.aten import int_mm_path

    path = int_mm_path.ProductPath(ops)
    rows: List[Dict[str, Any]] = []
    for k, n in INT_MM_SHAPES:
        a = torch.randint(-128, 128, (m, k), dtype=torch.int8).to(device)
        b = torch.randint(-128, 128, (n, k), dtype=torch.int8).to(device).t()
        row: Dict[str, Any] = {"M": m, "K": k, "N": n}
        row["fp32_chunks_ms"] = median_ms(lambda: path.forced(a, b, cube=False), sync, warmup, repeat)
        try:
            row["int8_cube_ms"] = median_ms(lambda: path.forced(a, b, cube=True), sync, warmup, repeat)
            row["equal"] = bool(torch.equal(path.forced(a, b, cube=True).cpu(),
                                            path.forced(a, b, cube=False).cpu()))
        except Exception as exc:  # an op-plugin before 7.0.0 refuses int32 output
            row["int8_cube"] = "refused: %s: %s" % (type(exc).__name__, str(exc).splitlines()[0][:120])
        rows.append(row)
    return rows


def _print_int_mm_table(rows: List[Dict[str, Any]], emulated: Optional[str]) -> None:
    print("")
    print("| _int_mm M | K | N | fp32 K-chunks ms | INT8 cube ms | speed-up | bit-equal |")
    print("|---:|---:|---:|---:|---:|---:|---|")
    for r in rows:
        if "int8_cube_ms" in r:
            print("| %d | %d | %d | %.3f | %.3f | %.2fx%s | %s |" % (
                r["M"], r["K"], r["N"], r["fp32_chunks_ms"], r["int8_cube_ms"],
                r["fp32_chunks_ms"] / r["int8_cube_ms"], " (emulated)" if emulated else "", r["equal"]))
        else:
            print("| %d | %d | %d | %.3f | %s | | |" % (r["M"], r["K"], r["N"], r["fp32_chunks_ms"],
                                                     r["int8_cube"]))


WEIGHT_LAYOUTS = (".t() view (the shim's)", "contiguous (K, N)", "NZ (npu_format_cast 29)")
NZ_FORMAT = 29  # ACL_FORMAT_FRACTAL_NZ


def _layout_weights(weight: Any, ops: Any) -> List[Tuple[str, Any]]:
    """The INT8 weight [N, K] as npu_quant_matmul's x2 in each layout; a cast that fails says why."""
    contiguous = weight.t().contiguous()
    try:
        nz = ops.npu_format_cast(contiguous.clone(), NZ_FORMAT)
    except Exception as exc:  # an old torch_npu, or a format this build refuses
        nz = "%s: %s" % (type(exc).__name__, str(exc).splitlines()[0] if str(exc) else "")
    return list(zip(WEIGHT_LAYOUTS, (weight.t(), contiguous, nz)))


def weight_layouts(m_values: List[int], repeat: int, warmup: int, setup: Tuple[Any, ...]) -> List[Dict[str, Any]]:
    """npu_quant_matmul alone (activations quantized beforehand) per INT8 weight layout.

    The shim passes the weight as its ``.t()`` view (no copy); vllm-ascend stores it
    contiguous and cast to FRACTAL_NZ. Nothing changes by default: this only times them.
    """
    import torch

    from ascend_shim.npu_math import int8 as int8_math

    device, ops, sync, _emulated = setup
    rows: List[Dict[str, Any]] = []
    for name, k, n in LAYERS:
        weight = torch.randint(-127, 128, (n, k), dtype=torch.int8).to(device)
        scale = int8_math.flat_weight_scale(torch.rand(n, 1, dtype=torch.float32).to(device) / 100)
        layouts = _layout_weights(weight, ops)
        for m in m_values:
            x_q, x_scale = ops.npu_dynamic_quant(torch.randn(m, k, dtype=torch.bfloat16).to(device))
            row: Dict[str, Any] = {"layer": name, "M": m, "K": k, "N": n}
            for label, x2 in layouts:
                if isinstance(x2, str):
                    row[label] = x2
                    continue
                row[label] = median_ms(lambda: ops.npu_quant_matmul(
                    x_q, x2, scale, pertoken_scale=x_scale.reshape(-1), output_dtype=torch.bfloat16),
                    sync, warmup, repeat)
            rows.append(row)
    return rows


def print_layout_table(rows: List[Dict[str, Any]], emulated: Optional[str]) -> None:
    print("")
    print("INT8 weight layout, npu_quant_matmul alone, ms%s:" % (" (emulated)" if emulated else ""))
    print("| layer | M | K | N | %s |" % " | ".join(WEIGHT_LAYOUTS))
    print("|---|---:|---:|---:|%s" % ("---:|" * len(WEIGHT_LAYOUTS)))
    for r in rows:
        cells = [("%.3f" % r[label]) if isinstance(r[label], float) else r[label] for label in WEIGHT_LAYOUTS]
        print("| %s | %d | %d | %d | %s |" % (r["layer"], r["M"], r["K"], r["N"], " | ".join(cells)))


def print_device_table(result: Dict[str, Any]) -> None:
    emulated = result["emulated"]
    if emulated:
        print("EMULATED NPU: %s. These timings are the emulation's, not an NPU's: the speed-ups "
              "say nothing about a 910B." % emulated)
    print("| layer | M | K | N | bf16 linear ms | INT8 ms | speed-up%s |" % (" (emulated)" if emulated else ""))
    print("|---|---:|---:|---:|---:|---:|---:|")
    for r in result["rows"]:
        print("| %s | %d | %d | %d | %.3f | %.3f | %.2fx |" % (
            r["layer"], r["M"], r["K"], r["N"], r["bf16_ms"], r["int8_ms"], r["speedup"]))
    if result.get("int_mm"):
        _print_int_mm_table(result["int_mm"], emulated)
    if result.get("sampler_ops"):
        _print_sampler_ops_table(result["sampler_ops"], emulated)
    print("median of %d run%s after %d warm-up, %s" % (
        result["repeat"], "" if result["repeat"] == 1 else "s", result["warmup"],
        "on the emulated device (not an NPU)" if emulated else "device synchronised"))
