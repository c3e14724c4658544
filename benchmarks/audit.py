"""Host cost of the audit (``ASCEND_SHIM_AUDIT=1``, engine/audit.py): on, per prompt and per op; off, none.

1. The same ComfyUI 0.30.0 prompt (tests/patches/audit_cases.py: ComfyUI's own
   ``uni_pc``, 6 steps, and a bf16 ``silu``, on the simulated 910B judged by
   torch_npu 2.12.0's registry) run --prompts times in one interpreter, every
   other one under the audit's mode as patches/comfyui/reports/audit.py runs it: the median
   host seconds of each kind (the first pair left out as warm-up), their
   **ratio**, and the added microseconds per aten call the mode saw.
2. Off: the same prompts with the audit off (the default), profiled: calls
   into the audit's modules while the prompts ran (must be 0) and the
   dispatch modes on the stack inside the node (must be 0).
3. The mode alone on plain CPU tensors, where an op costs what C++ dispatch
   costs (as on a real card, unlike the bed, whose every op is Python): µs per
   ``x.clone()`` (an op the dispatcher runs on a card, no dtype rule: the
   path most ops take) plain, under an empty ``TorchDispatchMode`` (what any
   Python mode costs) and under the audit's.

The bed computes every op in Python, so (1)'s ratio understates a real card's;
(3) gives the fixed cost a real card pays per op. Figures, not tests.

    python benchmarks/audit.py [--prompts 12] [--repeat 20000]
"""

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

import harness  # noqa: E402

CASES = harness.TESTS / "patches" / "audit_cases.py"


def prompts(args, extra, **env):
    with tempfile.TemporaryDirectory() as out:
        proc = harness.run([sys.executable, str(CASES), str(harness.comfyui_dir("0.30.0")), out, *extra],
                           harness.bed_env("ascend-cu130", kitchen="0.2.27", extra_path=(str(harness.REPO),), **env),
                           out, timeout=900)
        return harness.last_json(proc)


def mode_per_op_us(repeat):
    """Median µs per x.clone(): plain, under an empty TorchDispatchMode, under the audit's mode."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    from ascend_shim.engine import audit

    class Empty(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    x = torch.ones(4, 4)

    def loop():
        start = time.perf_counter()
        for _ in range(repeat):
            x.clone()
        return (time.perf_counter() - start) / repeat * 1e6

    times = {"plain": [], "empty mode": [], "audit": []}
    for _ in range(5):  # the contenders take turns within each round
        times["plain"].append(loop())
        with Empty():
            times["empty mode"].append(loop())
        mode = audit.start()
        times["audit"].append(loop())
        audit.stop(mode)
    return {name: statistics.median(values) for name, values in times.items()}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--prompts", type=int, default=12)
    parser.add_argument("--repeat", type=int, default=20000)
    options = parser.parse_args()
    count = options.prompts + options.prompts % 2

    result = prompts(options, ["--prompts", str(count), "--alternate"])
    seconds = result["seconds"][2:]
    off, on = statistics.median(seconds[0::2]), statistics.median(seconds[1::2])
    calls = result["aten_calls"]
    print("prompt (uni_pc 6 steps + bf16 silu, simulated 910B), median of %d each:" % (len(seconds) // 2))
    print("  audit off  %.1f ms" % (off * 1e3))
    print("  audit on   %.1f ms  (%d aten calls seen)" % (on * 1e3, calls))
    print("  ratio on/off  %.3f   added per aten call  %.1f us" % (on / off, (on - off) / calls * 1e6))

    quiet = prompts(options, ["--prompts", "2", "--profile"])
    print("audit off (default): calls into the audit's code while 2 prompts ran: %d; dispatch modes inside "
          "the node: %d; patch: %s (%s)" % (quiet["calls_into_audit"], quiet["inside"]["dispatch_modes"],
                                            quiet["rows"]["audit"]["state"], quiet["rows"]["audit"]["reason"]))

    us = mode_per_op_us(options.repeat)
    print("mode alone on CPU tensors, x.clone() (C++ dispatch, as on a card): %.2f us plain, %.2f us under an "
          "empty TorchDispatchMode, %.2f us under the audit: +%.2f us per op (of which the audit's own judging "
          "%.2f us), ratio %.2f" % (us["plain"], us["empty mode"], us["audit"], us["audit"] - us["plain"],
                                    us["audit"] - us["empty mode"], us["audit"] / us["plain"]))


if __name__ == "__main__":
    main()
