"""``aten::_int_mm`` on NPU tensors: the shim's two paths vs torch_npu's CPU fallback, on the test bed.

Three contenders, each in its own long-lived interpreter on the simulated
Ascend machine (``ASCEND_TESTBED=ascend-cu130``, shim in no-install mode,
comfy-kitchen 0.2.40 imported so the engine starts):
  cube      the shim's kernel on a bed whose ``npu_quant_matmul`` gives exact
            int32 output (op-plugin 7.0.0+): its probe passes, one INT8-cube call
  fp32      the shim's kernel on a bed modelling an op-plugin before 7.0.0
            (``TESTBED_QMM_INT32=refused``): its probe is refused, fp32 GEMMs
            over K-chunks of 1024
  fallback  ``ASCEND_SHIM_DISABLE=int_mm``: torch_npu's boxed CPU fallback (what
            eager gets without the shim)
The workers take turns per shape (order rotating each round); a turn is up to
--repeat warm ``torch._int_mm`` calls within --budget seconds, its median is
kept, and the figure is the median over --rounds turns. Workers run torch on
one thread (``OMP_NUM_THREADS=1``: on a shared 2-core machine more threads
spin against each other and swamp the figures). On the bed every path
computes on the host CPU, so the times compare the paths' host work here, not
910B kernels; the device-work table is what carries over:

- kernels: device kernels per call: non-view aten ops run on npu tensors plus
  torch_npu op calls (the fallback runs none: its work is on the host);
- operand bytes: what those kernels read (the op's int8 operands; for the
  fp32 path the int8 operands, their fp32 copies and each chunk's fp32 GEMM
  inputs), counted on the bed from tensor sizes;
- host<->device bytes: what the fallback has to move (both operands to the
  host, the int32 result back); the shim moves nothing;
- peak device bytes above the inputs and output: the fp32 path's K-chunks.

The first call of each worker (the cube path's one-call probe) is made before
anything is measured.

    python benchmarks/int_mm.py [--repeat 50] [--rounds 5] [--budget 0.5] [--json]
"""

import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from ab_timing import TAG, BedWorker, command_line, median_call  # noqa: E402  (beside this file)
from testbed.device_work import kernels as device_kernels  # noqa: E402

KITCHEN = "0.2.40"
# label, M, K, N, timed?: DiT-layer GEMMs as eager's W4A8/int8 paths issue them, for the
# device work; host time only on small ones, where the bed's host arithmetic (which a real NPU
# does not pay) stays below the per-call dispatch cost being compared
SHAPES = [("small", 16, 256, 256, True), ("one chunk", 64, 1024, 1024, True),
          ("decode row", 16, 3840, 3840, False), ("tile", 256, 3840, 10240, False),
          ("long K", 64, 12288, 3072, False)]
CONTENDERS = {"cube": {"TESTBED_QMM_INT32": "exact"}, "fp32": {"TESTBED_QMM_INT32": "refused"},
              "fallback": {"ASCEND_SHIM_DISABLE": "int_mm"}}


# --------------------------------------------------------------------------- worker (on the bed)

def worker():
    import warnings

    import comfy_kitchen  # noqa: F401  (starts the engine, as ComfyUI would)
    import torch
    import torch_npu  # noqa: F401
    from testbed import npu_device

    tb = torch_npu._testbed

    warnings.simplefilter("ignore")
    torch.manual_seed(0)
    operands = {}

    def make(i):
        if i not in operands:
            _, m, k, n, _timed = SHAPES[i]
            operands[i] = (torch.randint(-128, 128, (m, k), dtype=torch.int8).npu(),
                           torch.randint(-128, 128, (k, n), dtype=torch.int8).npu())
        return operands[i]

    def timed(i, calls, budget):
        a, b = make(i)
        seconds, timed_calls = median_call(lambda: torch._int_mm(a, b), calls, budget)
        return {"us": seconds * 1e6, "calls": timed_calls}

    def device(i):
        a, b = make(i)
        want = torch._int_mm(a.cpu(), b.cpu())
        torch._int_mm(make(0)[0], make(0)[1])  # the first call decides the path (its probe)
        tb.reset()
        base = npu_device.memory_allocated()
        npu_device.reset_peak_memory_stats()
        npu_device.reset_cpu_fallbacks()
        npu_device.reset_op_counts(enable=True)
        out = torch._int_mm(a, b)
        ops = npu_device.op_counts()
        npu_device.reset_op_counts(enable=False)
        fallbacks = sum(npu_device.cpu_fallbacks().values())
        peak = npu_device.max_memory_allocated() - base - out.nbytes
        moved = (a.nbytes + b.nbytes + out.nbytes) if fallbacks else 0
        # views, allocations and the aten::_int_mm entry itself are not device work (device_work.py)
        kernels = (0 if fallbacks else device_kernels(ops)) + sum(tb.calls.values())
        return {"kernels": kernels, "ops": dict(ops), "torch_npu_ops": dict(tb.calls),
                "operand_bytes": operand_bytes(ops, tb, a, b), "cpu_fallbacks": fallbacks, "moved": moved,
                "peak_extra": peak, "exact": bool(torch.equal(out.cpu(), want))}

    def operand_bytes(ops, tb, a, b):
        """Bytes the device kernels read: the op's operands, or the fp32 path's casts and GEMMs."""
        if tb.calls:
            return sum(tb.nbytes.values())
        if not ops.get("aten::mm"):
            return 0
        m, k = a.shape
        n = b.shape[1]
        chunks = -(-k // 1024)
        # casts read int8 a and b, the GEMMs fp32 a and b; per chunk the fp32 partial is read by
        # its int32 cast, and the int32 partial and the sum by the add
        return (m * k + k * n) * (1 + 4) + chunks * m * n * 4 + (chunks - 1) * m * n * 8

    for line in iter(sys.stdin.readline, ""):
        request = json.loads(line)
        if request["what"] == "time":
            answer = timed(request["shape"], request["repeat"], request["budget"])
        else:
            answer = device(request["shape"])
        print(TAG + json.dumps(answer), flush=True)


# --------------------------------------------------------------------------- driver

def measure(args):
    workers = {name: BedWorker(__file__, KITCHEN, env) for name, env in CONTENDERS.items()}
    try:
        results = []
        for i, (label, m, k, n, timed) in enumerate(SHAPES):
            row = {"label": label, "m": m, "k": k, "n": n, "time": {}, "device": {}}
            for name, w in workers.items():
                row["device"][name] = w.ask(what="device", shape=i)
            results.append(row)
            if not timed:
                continue
            turns = {name: [] for name in workers}
            order = list(workers)
            for r in range(args.rounds):
                for name in order[r % len(order):] + order[:r % len(order)]:
                    turns[name].append(workers[name].ask(what="time", shape=i, repeat=args.repeat,
                                                         budget=args.budget)["us"])
            row["time"] = {name: statistics.median(values) for name, values in turns.items()}
        return results
    finally:
        for w in workers.values():
            w.close()


def table(results):
    names = list(CONTENDERS)
    lines = ["| shape | M | K | N | " + " | ".join("%s µs" % n for n in names) + " | cube / fp32 | "
             "cube / fallback |", "|---|---:|---:|---:|" + "---:|" * (len(names) + 2)]
    for r in results:
        t = r["time"]
        if not t:
            continue
        lines.append("| %s | %d | %d | %d | %s | **%.3f** | **%.3f** |" % (
            r["label"], r["m"], r["k"], r["n"], " | ".join("%.1f" % t[n] for n in names),
            t["cube"] / t["fp32"], t["cube"] / t["fallback"]))
    lines += ["", "| shape | path | kernels on the device | torch_npu op calls | operand bytes read | "
              "CPU fallbacks | host<->device bytes | peak device bytes beyond in/out | exact |",
              "|---|---|---:|---:|---:|---:|---:|---:|---|"]
    for r in results:
        for name in names:
            d = r["device"][name]
            lines.append("| %s | %s | %d | %d | %d | %d | %d | %d | %s |" % (
                r["label"], name, d["kernels"], sum(d["torch_npu_ops"].values()), d["operand_bytes"],
                d["cpu_fallbacks"], d["moved"], d["peak_extra"], d["exact"]))
    return "\n".join(lines)


if __name__ == "__main__":
    command_line(__doc__, worker, measure, table, repeat=50, rounds=5)
