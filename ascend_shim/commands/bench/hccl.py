"""``python -m ascend_shim bench --hccl [2,4,8]``: HCCL at the sequence-parallel shapes, on N cards.

For each card count N it starts one process per card (``hccl_worker``), each with
``ASCEND_RT_VISIBLE_DEVICES`` set to its own card as a real multi-card launch does, joined on
torch.distributed's ``hccl`` backend, and times the Ulysses collectives of the seed user's step:
the all-to-all of one of q, k, v (each card's 15,655 / N tokens, 56 heads of 128, bf16) and the
all-gather of the hidden state's sequence shards. Each is shown as HCCL's own tools report it
(algorithm bandwidth: data / time) and as bus bandwidth (x (N - 1) / N, nccl-tests' convention),
beside the bus bandwidth the multi-card account assumes (``real_size_step.hccs_assumed_busbw``),
with its time per step at the measured rate. Fewer than two visible cards: one line, exit 3.
"""

import json
import os
import socket
import subprocess
import sys
import time
from typing import Any, Dict, List, Optional, Tuple

from ascend_shim.cli.hardware import emulation
from ascend_shim.commands.bench import timing
from ascend_shim.commands.bench import card_facts
from ascend_shim.cli import json_report as _json_report
from ascend_shim.commands.bench import real_size_step as step

DEFAULTS = (10, 2)
EMULATED_DEFAULTS = (3, 1)
TIMEOUT_S = 600        # a card count's whole run; HCCL's own init waits are inside it
TINY_TIMEOUT_S = 180
POLL_S = 0.1
PROBLEM = 1  # no card count could run HCCL


def _refuse(text: str, code: int) -> int:
    from ascend_shim.startup import output as _output

    _output.write("bench --hccl: %s" % text)
    return code


def visible_cards(count: int) -> List[str]:
    """The physical ids of the cards this process sees, in order (what each worker is given)."""
    named = os.environ.get("ASCEND_RT_VISIBLE_DEVICES")
    if named is None:
        return [str(i) for i in range(count)]
    cards = [part.strip() for part in named.split(",") if part.strip()]
    return cards[:count]


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _first_line(text: str) -> str:
    lines = [line for line in (text or "").strip().splitlines() if line.strip()]
    return lines[-1][:200] if lines else ""


def launch(cards: List[str], spec: Dict[str, Any], timeout: float) -> Tuple[Optional[Dict[str, Any]], Optional[str]]:
    """(rank 0's result, None) or (None, why not) for one run over ``cards``."""
    port = _free_port()
    processes = []
    for rank, card in enumerate(cards):
        env = dict(os.environ, ASCEND_RT_VISIBLE_DEVICES=card, RANK=str(rank), LOCAL_RANK="0",
                   WORLD_SIZE=str(len(cards)), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        processes.append(subprocess.Popen([sys.executable, "-m", "ascend_shim.commands.bench.hccl_worker",
                                           json.dumps(spec)], env=env, stdout=subprocess.PIPE,
                                          stderr=subprocess.PIPE, text=True))
    deadline = time.monotonic() + timeout
    failed = None
    try:
        while any(p.poll() is None for p in processes):
            failed = next((rank for rank, p in enumerate(processes) if p.poll() not in (None, 0)), None)
            if failed is not None or time.monotonic() > deadline:
                break
            time.sleep(POLL_S)
        else:
            failed = next((rank for rank, p in enumerate(processes) if p.returncode != 0), None)
    finally:
        for p in processes:  # a peer left waiting for a failed card would wait for HCCL's own timeout
            if p.poll() is None:
                p.kill()
        outputs = [p.communicate() for p in processes]
    if failed is not None:
        return None, "card %s (rank %d) failed: %s" % (cards[failed], failed, _first_line(outputs[failed][1]))
    if any(p.returncode != 0 for p in processes):
        return None, "did not finish in %d s" % timeout
    try:
        return json.loads(outputs[0][0].strip().splitlines()[-1]), None
    except (ValueError, IndexError):
        return None, "rank 0 printed no result: %s" % _first_line(outputs[0][1])


def rates(measured: Dict[str, Any], cards: int, dims: step.Dims) -> Dict[str, Any]:
    """Both collectives as algorithm and bus bandwidth beside the account's assumption, and per step."""
    assumed = step.hccs_assumed_busbw(cards)
    out = {}
    for name, nbytes, per_step in (
            ("all_to_all", measured["all_to_all_bytes_per_card"],
             step.ULYSSES_ALL_TO_ALL_PER_BLOCK * dims.block_calls),
            ("all_gather", measured["all_gather_bytes_out"], step.ULYSSES_ALL_GATHER_PER_FORWARD * dims.forwards)):
        seconds = measured[name + "_s"]
        algbw = nbytes / seconds / 1e9 if seconds > 0 else None
        out[name] = {"seconds": seconds, "bytes": nbytes, "algbw_gb_s": algbw,
                     "busbw_gb_s": algbw * (cards - 1) / cards if algbw is not None else None,
                     "assumed_busbw_gb_s": assumed, "calls_per_step": per_step, "step_s": seconds * per_step}
    return out


def run(options: Any) -> int:
    try:
        import torch
    except Exception as exc:
        return _refuse("needs torch: %s: %s" % (type(exc).__name__, exc), timing.NO_NPU)
    from ascend_shim.engine.npu import npu_reason

    reason = npu_reason()
    if reason is not None:
        return _refuse("needs Ascend NPUs: %s" % reason, timing.NO_NPU)
    cards = visible_cards(int(torch.npu.device_count()))  # type: ignore[attr-defined]
    if len(cards) < 2:
        return _refuse("needs at least 2 NPUs, this process sees %d%s" % (
            len(cards), " (ASCEND_RT_VISIBLE_DEVICES=%s)" % os.environ["ASCEND_RT_VISIBLE_DEVICES"]
            if "ASCEND_RT_VISIBLE_DEVICES" in os.environ else ""), timing.NO_NPU)
    device = torch.device("npu", torch.npu.current_device())  # type: ignore[attr-defined]
    emulated = emulation(torch, device)
    tiny = bool(options.tiny or emulated)
    dims = step.TINY if tiny else step.REAL
    repeat, warmup = EMULATED_DEFAULTS if emulated else DEFAULTS
    repeat = options.repeat if options.repeat is not None else repeat
    warmup = options.warmup if options.warmup is not None else warmup
    timeout = TINY_TIMEOUT_S if tiny else TIMEOUT_S
    spec = {"tokens": dims.tokens, "heads": dims.heads, "head_dim": dims.head_dim, "hidden": dims.hidden,
            "repeat": repeat, "warmup": warmup, "timeout_s": timeout}
    from ascend_shim import __version__

    result: Dict[str, Any] = {"kit": "bench --hccl", "ascend_shim": __version__, "simulated": emulated is not None,
                              "emulation": emulated, "tiny": tiny, "machine": card_facts.machine(torch, device),
                              "cards": cards, "dims": dict(dims._asdict(), tokens=dims.tokens),
                              "hccs_link_gb_s": step.HCCS_LINK_GB_S, "repeat": repeat, "warmup": warmup,
                              "runs": [], "interrupted": False,
                              "card_states": busy_cards(torch, max(c for c in options.hccl if c <= len(cards)))}
    try:
        for count in options.hccl:
            if count > len(cards):
                result["runs"].append({"cards": count, "skipped": "%d cards asked, %d visible" % (count, len(cards))})
                continue
            timing.progress("HCCL on %d cards (%s)" % (count, ",".join(cards[:count])))
            measured, why = launch(cards[:count], spec, timeout)
            entry: Dict[str, Any] = {"cards": count, "card_ids": cards[:count]}
            if measured is None:
                entry["skipped"] = why
            else:
                entry.update(tokens_per_card=measured["tokens_per_card"], **rates(measured, count, dims))
            result["runs"].append(entry)
    except KeyboardInterrupt:
        result["interrupted"] = True
    result["step_seconds"] = getattr(options, "step_seconds", None)
    result["predictions"] = predictions(result, result["step_seconds"])
    timing.progress("done" if not result["interrupted"] else "interrupted: printing what was measured")
    if options.json:
        _json_report.emit(as_json(result))
    else:
        print(markdown(result))
    if result["interrupted"]:
        return 130
    return 0 if any("skipped" not in r for r in result["runs"]) else PROBLEM


def predictions(result: Dict[str, Any], one_card_s: Optional[float]) -> List[Dict[str, Any]]:
    """The step on N cards from one card's: each card's share of it (the account's per-card bound on N
    cards over one card's) plus the collectives measured on N cards, not overlapped with compute."""
    if one_card_s is None or result["simulated"] or result["tiny"]:
        return []
    out = []
    for run_ in result["runs"]:
        share = step.PER_CARD_BOUND_S.get(run_["cards"])
        if "skipped" in run_ or share is None:
            continue
        compute = one_card_s * share / step.PER_CARD_BOUND_S[1]
        collectives = run_["all_to_all"]["step_s"] + run_["all_gather"]["step_s"]
        out.append({"cards": run_["cards"], "compute_s": compute, "collectives_s": collectives,
                    "step_s": compute + collectives, "speedup": one_card_s / (compute + collectives)})
    return out


def prediction_lines(result: Dict[str, Any]) -> List[str]:
    one_card = result.get("step_seconds")
    if one_card is None:
        return []
    if result["simulated"] or result["tiny"]:
        return ["", "Predicted step on N cards: not computed (%s: no time here is a 910B's)."
                % ("simulated" if result["simulated"] else "tiny shapes")]
    rows = result.get("predictions") or []
    out = ["", "Predicted step on N cards from one card's %.3f s: each card's share (the account's per-card bound, "
           "ascend_shim/commands/bench/real_size_step.py) plus the collectives above, not overlapped:" % one_card, "",
           "| cards | each card's share s | collectives s | **predicted s/step** | speed-up | the user's 8.09 s on one |",
           "|---:|---:|---:|---:|---:|---:|"]
    for row in rows:
        out.append("| %d | %.3f | %.3f | **%.3f** | %.2fx | %.2fx |" % (
            row["cards"], row["compute_s"], row["collectives_s"], row["step_s"], row["speedup"],
            step.USER_STEP_SECONDS / row["step_s"]))
    return out


def busy_cards(torch: Any, count: int) -> Dict[str, Any]:
    """Each card the runs use, checked before timing (a busy one is said on stderr at once)."""
    states = {}
    for index in range(count):
        state = card_facts.card_state(torch, torch.device("npu", index), samples=2)
        if state["busy"]:
            timing.progress(state["busy"])
        states["npu:%d" % index] = state
    return states


def as_json(result: Dict[str, Any]) -> Dict[str, Any]:
    if not result["simulated"]:
        return result
    measured = ("seconds", "algbw_gb_s", "busbw_gb_s", "step_s")
    runs = []
    for run_ in result["runs"]:
        runs.append({key: ({("simulated_" + k if k in measured else k): v for k, v in value.items()}
                           if isinstance(value, dict) else value) for key, value in run_.items()})
    return dict(result, runs=runs)


def _rate(value: Optional[float], simulated: bool) -> str:
    return "" if value is None else "%.4g GB/s%s" % (value, " (simulated)" if simulated else "")


def markdown(result: Dict[str, Any]) -> str:
    sim, m, dims = result["simulated"], result["machine"], result["dims"]
    out = ["### ascend_shim %s `bench --hccl`: Ulysses collectives of MiniMax-H3 at 864x480x121" % result["ascend_shim"],
           ""]
    if sim:
        out += ["**SIMULATED**: an emulated NPU (%s). Every time and rate below is the host's; none is HCCS's."
                % result["emulation"], ""]
    if result["tiny"]:
        out += ["Tiny shapes (%d tokens, hidden %d): a check that the kit runs, not the user's size." % (
            dims["tokens"], dims["hidden"]), ""]
    out.append("- cards: %s, %d visible (%s); torch %s, torch_npu %s, CANN %s, driver %s" % (
        m["card"], m["visible_cards"], ",".join(result["cards"]), m["torch"], m["torch_npu"], m["cann"] or "unknown",
        m["driver"] or "unknown"))
    out.append("- one process per card, torch.distributed backend hccl; median of %d after %d warm-up; algbw = data / "
               "time (HCCL's own tools), busbw = algbw x (N-1)/N; assumed: (N-1) x %g GB/s per direction, one HCCS "
               "link per peer (Atlas 800T A2: 7 links a card; Huawei's msprof rates a 910B link at 28 GB/s)" % (result["repeat"], result["warmup"],
                                                               result["hccs_link_gb_s"]))
    busy = [state["busy"] for state in result["card_states"].values() if state["busy"]]
    out += ["- before timing: %s" % ("BUSY: " + "; ".join(busy) if busy else "every card looked idle")]
    out += ["", "| cards | collective | data | %s | algbw | busbw | assumed busbw | calls/step | s/step |" % (
        "simulated ms" if sim else "ms"), "|---:|---|---:|---:|---:|---:|---:|---:|---:|"]
    for run_ in result["runs"]:
        if "skipped" in run_:
            out.append("| %d | not run: %s | | | | | | | |" % (run_["cards"], run_["skipped"]))
            continue
        for name, label in (("all_to_all", "all-to-all of q, k or v"), ("all_gather", "all-gather of the hidden shards")):
            r = run_[name]
            out.append("| %d | %s | %.4g MB%s | %.4g%s | %s | %s | %g GB/s | %d | %s |" % (
                run_["cards"], label, r["bytes"] / 1e6, " per card" if name == "all_to_all" else " gathered",
                r["seconds"] * 1e3, " (simulated)" if sim else "", _rate(r["algbw_gb_s"], sim),
                _rate(r["busbw_gb_s"], sim), r["assumed_busbw_gb_s"], r["calls_per_step"],
                "" if sim or result["tiny"] else "%.3f" % r["step_s"]))
    out += prediction_lines(result)
    if result["interrupted"]:
        out += ["", "**Interrupted (Ctrl-C)** after %d card counts: the rest was not measured." % len(result["runs"])]
    out += ["", "<details><summary>JSON</summary>", "", "```json", _json_report.dumps(as_json(result)), "```", "",
            "</details>"]
    return "\n".join(out)
