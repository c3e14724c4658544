"""``python -m ascend_shim bench --real-size``: the calibration kit for a real 910B.

Times, on one card, each op class of the seed user's MiniMax-H3 step at its real size
(``real_size_step``: the table ``benchmarks/real_size.py`` counts the step by) and the host <-> NPU
copies its weights make per prompt (``bench_copies``), then prints one block to paste into an issue:
a Markdown table with the card, torch, torch_npu, CANN and driver versions, and the same as JSON.

Before timing it says whether the card is busy (``card_facts``). A row that does not fit the card's
free memory, or runs out of it, says so and the rest runs; Ctrl-C prints what was measured (exit
130). On an emulated NPU (the test bed) every number is labelled simulated, the default shapes are
tiny, and no time is presented as a card's; ``--tiny`` gives the tiny shapes anywhere.
"""

from typing import Any, Dict, List, Optional

from ascend_shim.commands import bench, bench_copies, bench_step, card_facts
from ascend_shim.commands import json_report as _json_report
from ascend_shim.commands import real_size_step as step

SECTIONS = ("step", "copies")
# (repeat, warmup) when the command line does not say: a card, an emulated one
DEFAULTS = (10, 2)
EMULATED_DEFAULTS = (1, 0)
GIB = 1024.0 ** 3


def _refuse(text: str, code: int) -> int:
    from ascend_shim.startup import output as _output

    _output.write("bench --real-size: %s" % text)
    return code


def _free_bytes(torch: Any, device: Any, emulated: Optional[str]) -> Optional[int]:
    return bench.capacity(torch, device, emulated)[0]


def smallest_need(sections: List[str], dims: step.Dims, sizes: tuple) -> int:
    needs = []
    if "step" in sections:
        needs += [step.row_bytes(row) for row in step.rows(dims)]
    if "copies" in sections:
        needs.append(min(sizes))
    return min(needs)


def run(options: Any) -> int:
    try:
        import torch
    except Exception as exc:  # not installed, or torch_npu's autoload breaks it
        return _refuse("needs torch: %s: %s" % (type(exc).__name__, exc), bench.NO_NPU)
    from ascend_shim.engine.npu import npu_reason

    reason = npu_reason()
    if reason is not None:
        return _refuse("needs an Ascend NPU: %s" % reason, bench.NO_NPU)
    device, ops, sync, emulated = bench._device(torch, reason)
    sections = options.real_size
    tiny = bool(options.tiny or emulated)
    dims, sizes = (step.TINY, bench_copies.TINY_SIZES) if tiny else (step.REAL, bench_copies.SIZES)
    repeat, warmup = EMULATED_DEFAULTS if emulated else DEFAULTS
    repeat = options.repeat if options.repeat is not None else repeat
    warmup = options.warmup if options.warmup is not None else warmup
    free = _free_bytes(torch, device, emulated)
    need = smallest_need(sections, dims, sizes)
    if free is not None and need > free:
        return _refuse("%s has %.1f GiB free, the smallest row needs %.1f GiB: free the card (is ComfyUI "
                       "running on it?)%s" % (device, free / GIB, need / GIB, "" if tiny else " or pass --tiny"),
                       bench.USAGE)
    result = report_skeleton(torch, device, emulated, tiny, dims, sections, repeat, warmup)
    if result["card_state"]["busy"]:
        bench._progress(result["card_state"]["busy"])

    def median_ms(function: Any) -> float:
        return bench._median_ms(function, sync, warmup, repeat)

    try:
        if "step" in sections:
            bench_step.time_rows(torch, device, ops, dims, median_ms, lambda: _free_bytes(torch, device, emulated),
                                 bench._progress, result["step"]["rows"])
        if "copies" in sections:
            bench_copies.time_copies(torch, device, sizes, repeat, sync,
                                     lambda: _free_bytes(torch, device, emulated), bench._progress,
                                     result["copies"]["rows"])
    except KeyboardInterrupt:
        result["interrupted"] = True
    conclude(result, sections)
    bench._progress("done" if not result["interrupted"] else "interrupted: printing what was measured")
    if options.json:
        _json_report.emit(as_json(result))
    else:
        print(markdown(result))
    return 130 if result["interrupted"] else 0


def report_skeleton(torch: Any, device: Any, emulated: Optional[str], tiny: bool, dims: step.Dims,
                    sections: List[str], repeat: int, warmup: int) -> Dict[str, Any]:
    from ascend_shim import __version__

    return {"kit": "bench --real-size", "ascend_shim": __version__, "sections": list(sections),
            "simulated": emulated is not None, "emulation": emulated, "tiny": tiny,
            "machine": card_facts.machine(torch, device), "card_state": card_facts.card_state(torch, device),
            "dims": dict(dims._asdict(), tokens=dims.tokens), "user_run": step.USER_RUN,
            "user_step_s": step.USER_STEP_SECONDS,
            "peaks": {"bf16_tflops": step.BF16_TFLOPS, "int8_tops": step.INT8_TOPS, "hbm_tbps": step.HBM_TBPS},
            "repeat": repeat, "warmup": warmup, "interrupted": False,
            "step": {"rows": []}, "copies": {"rows": [], "anchor": bench_copies.ANCHOR}}


def why_not_predicted(result: Dict[str, Any]) -> Optional[str]:
    if result["simulated"]:
        return "simulated: the times are the host CPU's, not a card's"
    if result["tiny"]:
        return "tiny shapes (--tiny): the step runs at 15,655 tokens"
    return None


def conclude(result: Dict[str, Any], sections: List[str]) -> None:
    """The step's prediction and the pinned copy's saving, where the figures allow one."""
    not_predicted = why_not_predicted(result)
    if "step" in sections:
        summary = bench_step.prediction(result["step"]["rows"])
        if not_predicted:
            summary["predicted_s"] = None
            summary["not_predicted"] = not_predicted
        result["step"]["summary"] = summary
    if "copies" in sections:
        saving = None if not_predicted else bench_copies.pinned_copy_saving(result["copies"]["rows"],
                                                                              step.WEIGHTS_BYTES)
        result["copies"]["pinned_copy"] = saving
        if saving is None:
            result["copies"]["pinned_copy_not_computed"] = not_predicted or "a rate it needs was not measured"


# -- the paste-able block -----------------------------------------------------------------------

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


def parse_sections(text: str) -> List[str]:
    """``"step,copies"`` -> ["step", "copies"] (argparse type)."""
    import argparse

    parts = [p.strip() for p in text.split(",") if p.strip()]
    unknown = [p for p in parts if p not in SECTIONS]
    if not parts or unknown:
        raise argparse.ArgumentTypeError("%r: give %s, comma-separated" % (text, " and/or ".join(SECTIONS)))
    return [s for s in SECTIONS if s in parts]

