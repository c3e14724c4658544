"""``comfy_kitchen.w4a8_int8_linear`` per layer on the simulated Ascend bed: the shim vs eager.

Three contenders, each dispatched through ``ck.w4a8_int8_linear`` of
comfy-kitchen 0.2.40 in its own long-lived interpreter on the test bed
(``ASCEND_TESTBED=ascend-cu130``, shim in no-install mode, torch on one
thread: ``OMP_NUM_THREADS=1``):
  shim            the shim's W4A8 path: int4 codes decoded to int8 on the
                  device, one npu_dynamic_quant + one npu_quant_matmul
  eager+int_mm    kitchen's eager W4A8 (``ASCEND_SHIM_DISABLE=kitchen_int8``),
                  its ``torch._int_mm`` served by the shim's exact NPU kernel
  eager+fallback  kitchen's eager W4A8 without the shim (``ASCEND_SHIM=0``):
                  ``torch._int_mm`` on torch_npu's CPU fallback (the seed's bug)

1. Host time per call (µs), the quant ops in zero-cost mode (validated, no
   arithmetic; the other ops on the bed do their arithmetic on the host).
   Workers take turns per shape, the order rotating; a turn is up to
   --repeat calls within --budget seconds, its median kept; the figure is the
   median over --rounds turns. For the shim also the decode alone, which is
   what caching the decoded int8 weight would save.
2. Device work per call at DiT layer shapes: quant-op kernels, other non-view
   aten ops on npu tensors, CPU fallbacks and the bytes they move (operands
   to the host, result back), and the peak device memory above inputs and
   output in units of the packed weight (int4 codes, N*K/2 bytes); the
   decoded int8 weight alone is 2 units.
3. Numerics with real arithmetic: cosine against kitchen's eager on the CPU.

    python benchmarks/w4a8_linear.py [--repeat 20] [--rounds 3] [--budget 0.5] [--json]
"""

import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from ab_timing import TAG, BedWorker, command_line, median_call  # noqa: E402  (beside this file)
from testbed.device_work import is_view  # noqa: E402

KITCHEN = "0.2.40"
# label, M, K, N, timed?
SHAPES = [("small", 16, 256, 256, True), ("layer, M=16", 16, 1024, 1024, True),
          ("attn out, M=256", 256, 3072, 3072, False), ("ffn up, M=16", 16, 3072, 12288, False)]
CONTENDERS = {"shim": {}, "eager+int_mm": {"ASCEND_SHIM_DISABLE": "kitchen_int8"},
              "eager+fallback": {"ASCEND_SHIM": "0"}}
NUMERICS_M = 64


# --------------------------------------------------------------------------- worker (on the bed)

def worker():
    import warnings

    import comfy_kitchen as ck
    import torch
    import torch_npu
    from testbed import npu_device

    warnings.simplefilter("ignore")
    bed = torch_npu._testbed
    torch.manual_seed(0)
    layers = {}

    def make(i, m=None):
        _, m0, k, n, _timed = SHAPES[i]
        if i not in layers:
            qdata, s_rel, s_channel, _c, codebook = ck.quantize_w4a8_int8_weight(torch.randn(n, k) * 0.02)
            layers[i] = {"cpu": dict(qdata=qdata, s_rel=s_rel.float(), s_channel=s_channel, codebook=codebook)}
            layers[i]["npu"] = {key: value.npu() for key, value in layers[i]["cpu"].items()}
        x = torch.randn(m or m0, k, dtype=torch.bfloat16)
        return x, layers[i]

    def timed(fn, calls, budget):
        return median_call(fn, calls, budget)[0] * 1e6

    def host(i, repeat, budget):
        x, layer = make(i)
        x = x.npu()
        bed.zero_cost(True)
        try:
            answer = {"us": timed(lambda: ck.w4a8_int8_linear(x, **layer["npu"]), repeat, budget)}
            try:
                from ascend_shim.npu_math import w4a8_codes
            except ImportError:
                return answer
            w = layer["npu"]
            answer["decode_us"] = timed(lambda: w4a8_codes.decode_int4_to_int8(
                w["qdata"], w["s_rel"], w["codebook"], 16), repeat, budget)
            return answer
        finally:
            bed.zero_cost(False)

    def device(i):
        x, layer = make(i)
        x = x.npu()
        packed = layer["npu"]["qdata"].nbytes
        bed.zero_cost(True)
        try:
            ck.w4a8_int8_linear(x, **layer["npu"])  # warm: probes, first-call work
            base = npu_device.memory_allocated()
            npu_device.reset_peak_memory_stats()
            npu_device.reset_cpu_fallbacks()
            bed.reset()
            npu_device.reset_op_counts(enable=True)
            out = ck.w4a8_int8_linear(x, **layer["npu"])
            ops = npu_device.op_counts()
            npu_device.reset_op_counts(enable=False)
        finally:
            bed.zero_cost(False)
        fallbacks = npu_device.cpu_fallbacks()
        quant = bed.calls["npu_dynamic_quant"] + bed.calls["npu_quant_matmul"]
        other = sum(n for name, n in ops.items() if not is_view(name))
        _, m, k, n, _timed = SHAPES[i]
        moved = sum(fallbacks.values()) * (m * k + k * n + 4 * m * n)  # int8 operands out, int32 back
        return {"quant_kernels": quant, "other_ops": other, "cpu_fallbacks": sum(fallbacks.values()),
                "moved": moved, "peak_units": (npu_device.max_memory_allocated() - base - out.nbytes) / packed}

    def numerics(i):
        x, layer = make(i, NUMERICS_M)
        want = ck.w4a8_int8_linear(x, **layer["cpu"])
        got = ck.w4a8_int8_linear(x.npu(), **layer["npu"]).cpu()
        return {"cos": torch.nn.functional.cosine_similarity(got.float().flatten(), want.float().flatten(),
                                                             dim=0).item()}

    numerics(0)  # the first NPU call probes the quant ops: with real arithmetic
    for line in iter(sys.stdin.readline, ""):
        request = json.loads(line)
        if request["what"] == "time":
            answer = host(request["shape"], request["repeat"], request["budget"])
        elif request["what"] == "device":
            answer = device(request["shape"])
        else:
            answer = numerics(request["shape"])
        print(TAG + json.dumps(answer), flush=True)


# --------------------------------------------------------------------------- driver

def measure(args):
    workers = {name: BedWorker(__file__, KITCHEN, env) for name, env in CONTENDERS.items()}
    try:
        results = []
        for i, (label, m, k, n, timed) in enumerate(SHAPES):
            row = {"label": label, "m": m, "k": k, "n": n, "time": {}, "device": {}, "numerics": {}}
            for name, w in workers.items():
                row["device"][name] = w.ask(what="device", shape=i)
                row["numerics"][name] = w.ask(what="numerics", shape=i)
            results.append(row)
            if not timed:
                continue
            turns = {name: [] for name in workers}
            decode = []
            order = list(workers)
            for r in range(args.rounds):
                for name in order[r % len(order):] + order[:r % len(order)]:
                    answer = workers[name].ask(what="time", shape=i, repeat=args.repeat, budget=args.budget)
                    turns[name].append(answer["us"])
                    if name == "shim":
                        decode.append(answer["decode_us"])
            row["time"] = {name: statistics.median(values) for name, values in turns.items()}
            row["time"]["decode"] = statistics.median(decode)
        return results
    finally:
        for w in workers.values():
            w.close()


def table(results):
    lines = ["| layer | M | K | N | shim µs (decode µs) | eager+int_mm µs | eager+fallback µs | "
             "shim / eager+int_mm | shim / eager+fallback |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in results:
        t = r["time"]
        if not t:
            continue
        lines.append("| %s | %d | %d | %d | %.0f (%.0f) | %.0f | %.0f | **%.3f** | **%.3f** |" % (
            r["label"], r["m"], r["k"], r["n"], t["shim"], t["decode"], t["eager+int_mm"],
            t["eager+fallback"], t["shim"] / t["eager+int_mm"], t["shim"] / t["eager+fallback"]))
    lines += ["", "| layer | path | quant-op kernels | other device ops | CPU fallbacks | host<->device bytes "
              "| peak device memory / packed weight | cos vs CPU eager |",
              "|---|---|---:|---:|---:|---:|---:|---:|"]
    for r in results:
        for name in CONTENDERS:
            d, q = r["device"][name], r["numerics"][name]
            lines.append("| %s | %s | %d | %d | %d | %d | %.1f | %.6f |" % (
                r["label"], name, d["quant_kernels"], d["other_ops"], d["cpu_fallbacks"], d["moved"],
                d["peak_units"], q["cos"]))
    return "\n".join(lines)


if __name__ == "__main__":
    command_line(__doc__, worker, measure, table, repeat=20, rounds=3)
