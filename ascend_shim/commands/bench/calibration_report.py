"""``bench --real-size``'s block to paste: Markdown (the card, the versions, the tables) with the JSON.

On an emulated NPU every measured number is labelled simulated, in the Markdown and in the JSON
(``simulated_ms``, ``simulated_gb_per_s``), and no step time or saving is computed.
"""

from typing import Any, Dict, List, Optional

from ascend_shim.commands.bench import copies as bench_copies
from ascend_shim.cli import json_report as _json_report
from ascend_shim.commands.bench import real_size_step as step

GIB = 1024.0 ** 3


def as_json(result: Dict[str, Any]) -> Dict[str, Any]:
    """The report, every measured number under a ``simulated_`` name on an emulated NPU."""
    if not result["simulated"]:
        return result
    renamed = dict(result)
    renamed["step"] = dict(result["step"], rows=[_simulated(r, ("ms", "achieved", "step_s"))
                                                 for r in result["step"]["rows"]])
    renamed["copies"] = dict(result["copies"], rows=[_simulated(r, ("seconds", "gb_per_s"))
                                                     for r in result["copies"]["rows"]])
    return renamed


def _simulated(row: Dict[str, Any], keys: tuple) -> Dict[str, Any]:
    return {("simulated_" + k if k in keys else k): v for k, v in row.items()}


def _number(value: Optional[float], unit: str, simulated: bool) -> str:
    """Four significant digits (tiny shapes take microseconds), labelled where simulated."""
    if value is None:
        return ""
    return ("%.4g%s" % (value, unit)) + (" (simulated)" if simulated else "")


def header_lines(result: Dict[str, Any]) -> List[str]:
    m, dims = result["machine"], result["dims"]
    out = ["### ascend_shim %s `bench --real-size`: MiniMax-H3 int8 at 864x480x121, one card" % result["ascend_shim"],
           ""]
    if result["simulated"]:
        out += ["**SIMULATED**: an emulated NPU (%s). Every time and rate below is the host CPU's; none is a "
                "910B's." % result["emulation"], ""]
    if result["tiny"]:
        out += ["Tiny shapes (%d tokens, hidden %d): a check that the kit runs, not the user's size." % (
            dims["tokens"], dims["hidden"]), ""]
    cards = m["visible_cards"]
    out.append("- card: %s, %.1f GiB, %d visible%s; torch %s, torch_npu %s, CANN %s, driver %s" % (
        m["card"], m["memory_gib"], cards,
        " (ASCEND_RT_VISIBLE_DEVICES=%s)" % m["ASCEND_RT_VISIBLE_DEVICES"] if m["ASCEND_RT_VISIBLE_DEVICES"] else "",
        m["torch"], m["torch_npu"], m["cann"] or "unknown", m["driver"] or "unknown"))
    state = result["card_state"]
    utilization = state["utilization_percent"]
    out.append("- before timing: %s (%.1f GiB held outside this process, utilization %s)" % (
        "BUSY: " + state["busy"] if state["busy"] else "the card looked idle", state["held_elsewhere_bytes"] / GIB,
        "unknown" if utilization is None else "%.0f %%" % utilization))
    out.append("- median of %d run%s after %d warm-up, device synchronised; bound: the account's roofline at "
               "%g TFLOPS bf16, %g TOPS int8, %g TB/s" % (
                   result["repeat"], "" if result["repeat"] == 1 else "s", result["warmup"],
                   result["peaks"]["bf16_tflops"], result["peaks"]["int8_tops"], result["peaks"]["hbm_tbps"]))
    return out


def step_lines(result: Dict[str, Any]) -> List[str]:
    sim = result["simulated"]
    rows = result["step"]["rows"]
    out = ["", "| op class | shape | calls/step | %s | bound ms | %s | s/step |" % (
        "simulated ms" if sim else "ms", "simulated rate" if sim else "achieved"), "|---|---|---:|---:|---:|---:|---:|"]
    for r in rows:
        calls = "%d" % r["calls_per_step"] if r["in_step"] else "(%d)" % r["calls_per_step"]
        bound = _number(r["bound_ms"], "", False)
        if "ms" not in r:
            out.append("| %s | %s | %s | %s | %s | | |" % (r["op class"], r["shape"], calls,
                                                         "not timed: " + r["skipped"], bound))
            continue
        share = ("" if sim or result["tiny"] else "%.3f" % r["step_s"]) if r["in_step"] else "(instead of SDPA)"
        out.append("| %s | %s | %s | %s | %s | %s | %s |" % (r["op class"], r["shape"], calls, _number(r["ms"], "", sim),
                                                             bound, _number(r["achieved"], " " + r["unit"], sim),
                                                             share))
    summary = result["step"].get("summary")
    if summary:
        out.append("")
        if summary["predicted_s"] is None:
            out.append("No s/step predicted (%s). The user's run: %.2f s/step (161.81 s / 20 steps); the rows' "
                       "bound at this size: %.2f s/step." % (summary["not_predicted"], result["user_step_s"],
                                                             summary["bound_s"]))
        else:
            out.append("**Predicted: %.2f s/step** (the sum of ms x calls/step over %d of %d rows%s) beside the "
                       "user's **%.2f s/step** (161.81 s / 20 steps); the same rows' bound: %.2f s/step." % (
                           summary["predicted_s"], summary["rows_timed"], summary["rows_in_step"],
                           "; not timed: " + ", ".join(summary["missing"]) if summary["missing"] else "",
                           result["user_step_s"], summary["bound_s"]))
    return out


def copy_lines(result: Dict[str, Any]) -> List[str]:
    sim = result["simulated"]
    rows = result["copies"]["rows"]
    sizes = sorted({r["bytes"] for r in rows})
    out = ["", "| copy | %s |" % " | ".join(bench_copies.size_text(s) for s in sizes),
           "|---|%s" % ("---:|" * len(sizes))]
    for key, label, _ in bench_copies.ROWS:
        cells = []
        for size in sizes:
            entry = next((r for r in rows if r["key"] == key and r["bytes"] == size), None)
            if entry is None:
                cells.append("")
            elif "gb_per_s" in entry:
                cells.append(_number(entry["gb_per_s"], " GB/s", sim))
            else:
                cells.append("not timed: %s" % entry["skipped"])
        if any(cells):
            out.append("| %s | %s |" % (label, " | ".join(cells)))
    out += ["", "Public anchor: %s; on GPUs pageable device->host copies run 10-25x slower than pinned ones."
            % result["copies"]["anchor"]]
    saving = result["copies"].get("pinned_copy")
    gb = step.WEIGHTS_BYTES / 1e9
    if saving:
        rates = saving["rates_gb_per_s"]
        out += ["", "A pinned host copy of the seed user's %.2f GB of weights (`--disable-smart-memory`: every "
                "prompt loads them and copies them back):" % gb,
                "- today: load from pageable memory %.2f GB / %.2f GB/s = %.2f s, unload into fresh pageable "
                "memory %.2f GB / %.2f GB/s = %.2f s: %.2f s per prompt" % (
                    gb, rates["pageable_h2d"], saving["load_pageable_s"], gb, rates["fresh_d2h"],
                    saving["unload_fresh_s"], saving["today_s"]),
                "- kept pinned: load %.2f GB / %.2f GB/s = %.2f s, unload 0 s (the host copy stays, the card's "
                "is dropped): **saves %.2f s per prompt**, holding %.2f GB of pinned host memory" % (
                    gb, rates["pinned_h2d"], saving["load_pinned_s"], saving["saved_s"], gb)]
    else:
        out += ["", "A pinned host copy of the seed user's %.2f GB of weights would save, per prompt, W / "
                "(pageable host->NPU) + W / (NPU->fresh pageable) - W / (pinned host->NPU), W = %.2f GB: not "
                "computed here (%s)." % (gb, gb, result["copies"].get("pinned_copy_not_computed"))]
    return out


def markdown(result: Dict[str, Any]) -> str:
    out = header_lines(result)
    if "step" in result["sections"]:
        out += step_lines(result)
    if "copies" in result["sections"]:
        out += copy_lines(result)
    if result["interrupted"]:
        out += ["", "**Interrupted (Ctrl-C)** after %d step rows and %d copies: the rest was not measured." % (
            len(result["step"]["rows"]), len(result["copies"]["rows"]))]
    out += ["", "<details><summary>JSON</summary>", "", "```json", _json_report.dumps(as_json(result)), "```", "",
            "</details>"]
    return "\n".join(out)
