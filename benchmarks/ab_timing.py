"""What the side-by-side kernel benchmarks share (int8_linear, w4a8_linear, int_mm).

Each starts one worker process per contender and asks them in turn, round after round, for
one call's median time; the workers time with :func:`median_call` and answer on a line that
starts with ``TAG``. ``int_mm`` and ``w4a8_linear`` start their workers on the simulated Ascend
bed as :class:`BedWorker` and read their command line with :func:`command_line`.
"""

import argparse
import gc
import json
import statistics
import subprocess
import sys
import time

TAG = "@@bench "  # a worker's answer line; anything else it prints is passed over


def median_call(fn, calls, budget):
    """(median seconds of one ``fn()`` call, calls timed): at most ``calls`` calls, ending once
    ``budget`` seconds have passed and three are timed. The collector is off while timing, and
    freeing each output stays outside the timed span."""
    samples, deadline = [], time.perf_counter() + budget
    gc.disable()
    try:
        for _ in range(calls):
            start = time.perf_counter()
            out = fn()
            stop = time.perf_counter()
            del out
            samples.append(stop - start)
            if stop > deadline and len(samples) >= 3:
                break
    finally:
        gc.enable()
    return statistics.median(samples), len(samples)


def command_line(doc, worker, measure, table, repeat, rounds, budget=0.5):
    """``--repeat``/``--rounds``/``--budget``/``--json``; ``--worker`` (hidden) runs the worker."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--repeat", type=int, default=repeat)
    parser.add_argument("--rounds", type=int, default=rounds)
    parser.add_argument("--budget", type=float, default=budget)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if args.worker:
        worker()
        return
    results = measure(args)
    print(json.dumps(results, indent=1) if args.json else table(results))


class BedWorker:
    """``script --worker`` on the simulated Ascend bed with comfy-kitchen ``kitchen``, asked by line."""

    def __init__(self, script, kitchen, env):
        import harness  # tests/, which the benchmark put on sys.path

        self.proc = subprocess.Popen(
            [sys.executable, script, "--worker"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            text=True, cwd=str(harness.REPO),
            env=harness.bed_env("ascend-cu130", kitchen=kitchen, extra_path=[str(harness.REPO)],
                                OMP_NUM_THREADS="1", **env))

    def ask(self, **request):
        self.proc.stdin.write(json.dumps(request) + "\n")
        self.proc.stdin.flush()
        for line in iter(self.proc.stdout.readline, ""):
            if line.startswith(TAG):
                return json.loads(line[len(TAG):])
        raise RuntimeError("worker ended: rc=%s" % self.proc.wait())

    def close(self):
        self.proc.stdin.close()
        self.proc.wait(timeout=60)
