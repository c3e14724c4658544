"""Host cost and device work of ``comfy_kitchen.int8_linear`` on the simulated Ascend bed.

Three contenders, each dispatched through ``ck.int8_linear`` of comfy-kitchen
0.2.40 in its own long-lived interpreter on the test bed
(``ASCEND_TESTBED=ascend-cu130``, shim in no-install mode):
  shim      the shim's ``ascend_shim`` backend    (ASCEND_SHIM_INT8=shim)
  upstream  kitchen's own ``ascend`` backend      (ASCEND_SHIM=0)
  seed      the seed user's hand-written recipe, a dummy ``seed_recipe``
            backend put first (ASCEND_SHIM=0); it transposes the weight and
            makes it contiguous on every call
plus ``bare``: the two quant ops called directly with prepared arguments (the
bed's floor for any path). ``get_capable_backend`` names who served each.
On the bed every aten op on an npu tensor, views included, goes through
Python dispatch (tens of us), so absolute times are the bed's, not a 910B's;
compare the contenders with one another and with ``bare``.

1. Host time per call, fake quant ops in zero-cost mode (inputs validated, no
   arithmetic): the Python/dispatch cost of each path plus any real copy it
   makes (the seed's weight copy is real CPU work here); one real call before
   zero-cost mode lets the shim's one-time capability probe compute. The workers take
   turns, rotating the order each round; a turn is up to --repeat warm calls
   (at most --budget seconds), its median is kept, and the figure is the
   median over --rounds turns. Target: shim <= upstream.
2. Device work per call: quant-op kernels and bytes handed to each op
   (``torch_npu._testbed``), other non-view aten ops on npu tensors, weight-
   sized copies (non-view ops reading the weight's storage and returning a
   weight-sized tensor), and whether npu_quant_matmul's ``x2`` shares the
   stored weight's storage. Target: 2 kernels, 0 weight-sized copies.
3. Numerics at M=64 with real arithmetic: cosine and relative MAE against a
   float32 matmul with the dequantized weight.

Shapes: Z-Image Turbo layers (comfy-kitchen PR #153, M=8352 tokens) plus one
small-M row; bf16 x, int8 weight, per-channel [N, 1] fp32 scale, no bias.

    python benchmarks/int8_linear.py [--repeat 200] [--rounds 7] [--budget 0.3] [--json]
"""

import argparse
import inspect
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

import harness  # noqa: E402
from ab_timing import TAG, median_call  # noqa: E402  (beside this file)

KITCHEN = "0.2.40"
SHAPES = [("attn out", 8352, 3840, 3840), ("qkv", 8352, 3840, 11520), ("ffn w1", 8352, 3840, 10240),
          ("ffn w2", 8352, 10240, 3840), ("attn out M=16", 16, 3840, 3840)]  # label, M, K, N
CONTENDERS = {"shim": {"ASCEND_SHIM_INT8": "shim"}, "upstream": {"ASCEND_SHIM": "0"},
              "seed": {"ASCEND_SHIM": "0"}}
TURNS = [("shim", "shim", "ck"), ("upstream", "upstream", "ck"), ("seed", "seed", "ck"),
         ("bare", "upstream", "bare")]  # column, worker, what it times
NUMERICS_M = 64


# --------------------------------------------------------------------------- worker (on the bed)

def seed_recipe(x, weight, weight_scale, bias=None, out_dtype=None, **_options):
    """The recipe the seed report describes, in our own words."""
    import torch
    import torch_npu
    out_dtype = out_dtype or torch.bfloat16
    x8, x_scale = torch_npu.npu_dynamic_quant(x.reshape(-1, x.shape[-1]).contiguous())
    out = torch_npu.npu_quant_matmul(
        x8.contiguous(),
        weight.T.contiguous(),  # a weight-sized copy on every call
        weight_scale.reshape(-1).to(torch.float32).contiguous(),
        pertoken_scale=x_scale.reshape(-1).float().contiguous(),
        bias=bias, output_dtype=out_dtype)
    return out.reshape(*x.shape[:-1], weight.shape[0])


def register_seed(registry):
    import types

    import torch
    from comfy_kitchen.constraints import FunctionConstraints, ParamConstraint
    params = {"x": ParamConstraint(dtypes=frozenset({torch.float16, torch.bfloat16})),
              "weight": ParamConstraint(dtypes=frozenset({torch.int8}))}
    registry.register("seed_recipe", types.SimpleNamespace(int8_linear=seed_recipe),
                      {"int8_linear": FunctionConstraints(params=params, default_devices=frozenset({"npu"}))})
    registry.set_priority(["seed_recipe"] + [n for n in registry._priority if n != "seed_recipe"])


def copy_tracer(weight):
    """A dispatch mode listing non-view npu ops and counting copies of ``weight``."""
    import torch
    from testbed import npu_device
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_flatten
    wptr = npu_device.storage_ptr(weight)

    class Tracer(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops, self.weight_copies, self.copied_bytes = [], 0, 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if func.is_view or not npu_device.is_npu_tensor(out):
                return out
            self.ops.append(func._schema.name)
            inputs = [a for a in tree_flatten((args, kwargs))[0] if isinstance(a, torch.Tensor)]
            if (any(npu_device.storage_ptr(a) == wptr for a in inputs) and out.nbytes == weight.nbytes
                    and npu_device.storage_ptr(out) != wptr):
                self.weight_copies += 1
                self.copied_bytes += out.nbytes
            return out

    return Tracer()


def worker(name):
    import comfy_kitchen as ck
    import torch
    import torch_npu
    from comfy_kitchen.registry import registry
    from testbed import npu_device
    if name == "seed":
        register_seed(registry)
    bed = torch_npu._testbed
    # one real call first: a backend's one-time capability probe must see real arithmetic
    ck.int8_linear(torch.randn(2, 64).to(torch.bfloat16).to("npu"),
                   torch.randint(-127, 128, (16, 64), dtype=torch.int8).to("npu"),
                   torch.rand(16, 1).to("npu"), None, torch.bfloat16)
    bed.zero_cost(True)
    torch.manual_seed(0)
    weights, inputs = {}, {}

    def make(i, m=None):
        _, m0, k, n = SHAPES[i]
        if i not in weights:
            weights[i] = (torch.randint(-127, 128, (n, k), dtype=torch.int8).to("npu"),
                          (torch.rand(n, 1) * 1e-3 + 1e-4).to("npu"))
        if (i, m or m0) not in inputs:
            inputs[i, m or m0] = torch.randn(m or m0, k).to(torch.bfloat16).to("npu")
        return (inputs[i, m or m0],) + weights[i]

    def call(x, w, scale):
        return ck.int8_linear(x, w, scale, None, torch.bfloat16)

    def bare(x, w, scale):
        wt, flat = w.t(), scale.reshape(-1)

        def run():
            x8, x_scale = torch_npu.npu_dynamic_quant(x)
            return torch_npu.npu_quant_matmul(x8, wt, flat, pertoken_scale=x_scale,
                                              output_dtype=torch.bfloat16)
        return run

    def served(x, w, scale):  # the kwargs ck.int8_linear hands the registry
        bound = inspect.signature(ck.int8_linear).bind(x, w, scale, None, torch.bfloat16)
        bound.apply_defaults()
        return registry.get_capable_backend("int8_linear", bound.arguments)

    def timed(i, calls, budget, what="ck"):
        args = make(i)
        fn = (lambda: call(*args)) if what == "ck" else bare(*args)
        seconds, timed_calls = median_call(fn, calls, budget)
        return {"us": seconds * 1e6, "calls": timed_calls}

    def device(i):
        x, w, scale = make(i)
        bed.reset()
        with copy_tracer(w) as tracer:
            out = call(x, w, scale)
        del out
        mm = bed.last("npu_quant_matmul")
        return {"kernels": bed.calls["npu_dynamic_quant"] + bed.calls["npu_quant_matmul"],
                "nbytes": dict(bed.nbytes), "other_ops": sorted(tracer.ops),
                "weight_copies": tracer.weight_copies, "copied_bytes": tracer.copied_bytes,
                "x2_shares_weight": mm is not None and mm["x2"].storage_ptr == npu_device.storage_ptr(w),
                "x2_layout": mm and mm.notes.get("x2_layout")}

    def numerics(i):
        x, w, scale = make(i, NUMERICS_M)
        bed.zero_cost(False)
        try:
            out = call(x, w, scale).cpu().float().reshape(-1)
        finally:
            bed.zero_cost(True)
        ref = (x.cpu().float() @ (w.cpu().float() * scale.cpu()).t()).reshape(-1)
        return {"cos": torch.nn.functional.cosine_similarity(out, ref, dim=0).item(),
                "rel_mae": ((out - ref).abs().mean() / ref.abs().mean()).item()}

    for line in iter(sys.stdin.readline, ""):
        cmd = json.loads(line)
        if cmd["cmd"] == "setup":
            result = [served(*make(i)) for i in range(len(SHAPES))]
            for i in range(len(SHAPES)):
                timed(i, cmd["warm"], 1.0)
                timed(i, cmd["warm"], 1.0, "bare")
        elif cmd["cmd"] == "time":
            result = timed(cmd["shape"], cmd["calls"], cmd["budget"], cmd["what"])
        else:
            result = [{"device": device, "numerics": numerics}[cmd["cmd"]](i) for i in range(len(SHAPES))]
        sys.stdout.write(TAG + json.dumps(result) + "\n")
        sys.stdout.flush()


# --------------------------------------------------------------------------- driver

class Worker:
    def __init__(self, name, python):
        env = harness.bed_env("ascend-cu130", kitchen=KITCHEN, extra_path=[harness.REPO], **CONTENDERS[name])
        self.name = name
        self.proc = subprocess.Popen([python, str(Path(__file__).resolve()), "--worker", name], env=env,
                                     cwd=str(harness.REPO), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     text=True)

    def ask(self, **cmd):
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()
        for line in iter(self.proc.stdout.readline, ""):
            if line.startswith(TAG):
                return json.loads(line[len(TAG):])
        raise RuntimeError("worker %s ended (rc %s)" % (self.name, self.proc.wait()))

    def close(self):
        try:
            self.proc.stdin.close()  # EOF ends the worker's loop
            self.proc.wait(timeout=60)
        except (OSError, subprocess.TimeoutExpired):
            self.proc.kill()
            self.proc.wait()


def measure(options):
    workers = {name: Worker(name, options.python) for name in CONTENDERS}
    try:
        served = {name: w.ask(cmd="setup", warm=10) for name, w in workers.items()}
        turns = {col: [[] for _ in SHAPES] for col, _, _ in TURNS}
        calls = {col: [0] * len(SHAPES) for col, _, _ in TURNS}
        for r in range(options.rounds):
            for i in range(len(SHAPES)):
                for col, name, what in TURNS[r % len(TURNS):] + TURNS[:r % len(TURNS)]:
                    got = workers[name].ask(cmd="time", what=what, shape=i, calls=options.repeat,
                                            budget=options.budget)
                    turns[col][i].append(got["us"])
                    calls[col][i] += got["calls"]
        device = {name: w.ask(cmd="device") for name, w in workers.items()}
        numerics = {name: w.ask(cmd="numerics") for name, w in workers.items()}
    finally:
        for w in workers.values():
            w.close()
    rows = []
    for i, (label, m, k, n) in enumerate(SHAPES):
        host = {col: statistics.median(turns[col][i]) for col in turns}
        rows.append({"shape": label, "M": m, "K": k, "N": n, "host_us": host,
                     "host_us_per_round": {col: turns[col][i] for col in turns},
                     "calls_timed": {col: calls[col][i] for col in calls},
                     "shim_over_upstream": host["shim"] / host["upstream"],
                     "seed_over_upstream": host["seed"] / host["upstream"],
                     "served_by": {name: served[name][i] for name in CONTENDERS},
                     "device": {name: device[name][i] for name in CONTENDERS},
                     "numerics": {name: numerics[name][i] for name in CONTENDERS}})
    return {"kitchen": KITCHEN, "rounds": options.rounds, "repeat": options.repeat,
            "budget_s": options.budget, "numerics_m": NUMERICS_M, "rows": rows,
            "targets": {"host": "shim_over_upstream <= 1.0",
                        "device": "2 quant-op kernels and 0 weight-sized copies per call"}}


def report(res):
    rows, names = res["rows"], list(CONTENDERS)
    print("comfy_kitchen.int8_linear on the simulated Ascend bed: kitchen %s, bf16 x, int8 weight, "
          "per-channel scale, no bias" % res["kitchen"])
    print("served by: " + ", ".join("%s -> %s" % (n, "/".join(sorted({r["served_by"][n] for r in rows})))
                                    for n in names))
    print("\n1. Host time per call (us), quant ops zero-cost; median of %d rotating rounds, each the "
          "median of up to %d calls or %.2fs" % (res["rounds"], res["repeat"], res["budget_s"]))
    head = ("shape", "M", "K", "N", "bare ops", "shim", "upstream", "seed", "shim/up", "seed/up")
    print("%-14s %5s %6s %6s %9s %9s %9s %9s %8s %8s" % head)
    for r in rows:
        h = r["host_us"]
        print("%-14s %5d %6d %6d %9.1f %9.1f %9.1f %9.1f %8.3f %8.2f" % (
            r["shape"], r["M"], r["K"], r["N"], h["bare"], h["shim"], h["upstream"], h["seed"],
            r["shim_over_upstream"], r["seed_over_upstream"]))
    cols = ("shim", "upstream", "seed", "bare")
    print("calls timed (%s): " % "/".join(cols) + "; ".join(
        "%s %s" % (r["shape"], "/".join(str(r["calls_timed"][c]) for c in cols)) for r in rows))
    worst = max(r["shim_over_upstream"] for r in rows)
    print("target: shim host time <= upstream's (shim/up <= 1); largest shim/up here: %.3f" % worst)

    print("\n2. Device work per call (MB handed to each quant op; x2: npu_quant_matmul's weight operand)")
    print("%-14s %-9s %7s %8s %8s %-11s %-9s %6s %8s  %s" % (
        "shape", "path", "kernels", "dq MB", "qmm MB", "x2 layout", "x2=weight", "w copy", "copy MB",
        "other npu ops"))
    for r in rows:
        for n in names:
            d = r["device"][n]
            print("%-14s %-9s %7d %8.1f %8.1f %-11s %-9s %6d %8.1f  %s" % (
                r["shape"], n, d["kernels"], d["nbytes"].get("npu_dynamic_quant", 0) / 1e6,
                d["nbytes"].get("npu_quant_matmul", 0) / 1e6, d["x2_layout"],
                "yes" if d["x2_shares_weight"] else "no", d["weight_copies"], d["copied_bytes"] / 1e6,
                ",".join(d["other_ops"]) or "-"))
    shim = [r["device"]["shim"] for r in rows]
    print("target: 2 device kernels and 0 weight-sized copies per standard call; shim here: kernels %s, "
          "weight copies %s" % ("/".join(sorted({str(d["kernels"]) for d in shim})),
                                "/".join(sorted({str(d["weight_copies"]) for d in shim}))))

    print("\n3. Numerics at M=%d, real arithmetic, vs float32 matmul with the dequantized weight"
          % res["numerics_m"])
    print(("%-14s " % "shape" + " ".join("%-22s" % ("%s cos / relMAE" % n) for n in names)).rstrip())
    for r in rows:
        print(("%-14s " % r["shape"] + " ".join("%-22s" % ("%.6f / %.3f%%" % (
            r["numerics"][n]["cos"], 100 * r["numerics"][n]["rel_mae"])) for n in names)).rstrip())


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=200, help="max timed calls per turn (default 200)")
    parser.add_argument("--rounds", type=int, default=7, help="rotating rounds (default 7)")
    parser.add_argument("--budget", type=float, default=0.3, help="max seconds per turn (default 0.3)")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of tables")
    parser.add_argument("--python", default=sys.executable, help="interpreter with torch for the workers")
    parser.add_argument("--worker", choices=sorted(CONTENDERS), help=argparse.SUPPRESS)
    options = parser.parse_args(argv)
    if options.worker:
        return worker(options.worker)
    start = time.perf_counter()
    result = measure(options)
    result["wall_s"] = round(time.perf_counter() - start, 1)
    if options.json:
        print(json.dumps(result))
    else:
        report(result)
        print("\nwall time %.1fs" % result["wall_s"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
