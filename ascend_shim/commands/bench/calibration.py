"""``python -m ascend_shim bench --real-size``: the calibration kit for a real 910B.

Times, on one card, each op class of the seed user's MiniMax-H3 step at its real size
(``real_size_step``: the table ``benchmarks/real_size.py`` counts the step by) and the host <-> NPU
copies its weights make per prompt (``copies``), then prints one block to paste into an issue:
a Markdown table with the card, torch, torch_npu, CANN and driver versions, and the same as JSON.

Before timing it says whether the card is busy (``card_facts``). A row that does not fit the card's
free memory, or runs out of it, says so and the rest runs; Ctrl-C prints what was measured (exit
130). On an emulated NPU (the test bed) every number is labelled simulated, the default shapes are
tiny, and no time is presented as a card's; ``--tiny`` gives the tiny shapes anywhere.
"""

from typing import Any, Dict, List, Optional

from ascend_shim.commands.bench import timing
from ascend_shim.commands.bench import copies as bench_copies
from ascend_shim.commands.bench import step as bench_step
from ascend_shim.commands.bench import calibration_report
from ascend_shim.commands.bench import card_facts
from ascend_shim.cli import interrupt
from ascend_shim.cli import json_report as _json_report
from ascend_shim.commands.bench import real_size_step as step

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
    return timing.capacity(torch, device, emulated)[0]


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
        return _refuse("needs torch: %s: %s" % (type(exc).__name__, exc), timing.NO_NPU)
    from ascend_shim.engine.npu import npu_reason

    reason = npu_reason()
    if reason is not None:
        return _refuse("needs an Ascend NPU: %s" % reason, timing.NO_NPU)
    device, ops, sync, emulated = timing.device_setup(torch, reason)
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
                       timing.USAGE)
    result = report_skeleton(torch, device, emulated, tiny, dims, sections, repeat, warmup)
    if result["card_state"]["busy"]:
        timing.progress(result["card_state"]["busy"])

    def median_ms(function: Any) -> float:
        return timing.median_ms(function, sync, warmup, repeat)

    try:
        with interrupt.watching():
            _time_sections(torch, device, ops, dims, sizes, sections, repeat, sync, median_ms, emulated, result)
    except KeyboardInterrupt:
        result["interrupted"] = True
    conclude(result, sections)
    timing.progress("done" if not result["interrupted"] else "interrupted: printing what was measured")
    if options.json:
        _json_report.emit(calibration_report.as_json(result))
    else:
        print(calibration_report.markdown(result))
    return 130 if result["interrupted"] else 0


def _time_sections(torch: Any, device: Any, ops: Any, dims: step.Dims, sizes: Any, sections: List[str], repeat: int,
                   sync: Any, median_ms: Any, emulated: Optional[str], result: Dict[str, Any]) -> None:
    """Each section's rows into ``result`` as they finish (a Ctrl-C keeps what was measured)."""
    if "step" in sections:
        bench_step.time_rows(torch, device, ops, dims, median_ms, lambda: _free_bytes(torch, device, emulated),
                             timing.progress, result["step"]["rows"])
    if "copies" in sections:
        bench_copies.time_copies(torch, device, sizes, repeat, sync, lambda: _free_bytes(torch, device, emulated),
                                 timing.progress, result["copies"]["rows"])


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


def parse_sections(text: str) -> List[str]:
    """``"step,copies"`` -> ["step", "copies"] (argparse type)."""
    import argparse

    parts = [p.strip() for p in text.split(",") if p.strip()]
    unknown = [p for p in parts if p not in SECTIONS]
    if not parts or unknown:
        raise argparse.ArgumentTypeError("%r: give %s, comma-separated" % (text, " and/or ".join(SECTIONS)))
    return [s for s in SECTIONS if s in parts]

