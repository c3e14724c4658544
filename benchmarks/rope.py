"""comfy-kitchen's RoPE family on the test bed: the shim's fused backend vs eager vs upstream ``ascend``.

One interpreter on the simulated Ascend machine (``ASCEND_TESTBED=ascend-cu130``,
shim in no-install mode, comfy-kitchen 0.2.40, ``ASCEND_SHIM_INT8=shim``).
The fake torch_npu's ``npu_rotary_mul`` / ``npu_rms_norm`` are served through
the real wheel's schemas (``torch.ops`` packets, as torch_npu exposes them),
so upstream's ``ascend`` backend (which reads the schema) registers its RoPE
too. Each contender is forced with ``registry.use_backend``:

  shim      ``ascend_shim_rope``: coefficients cached per freqs_cis (warm: a hit)
  eager     what ComfyUI 0.30 (kitchen 0.2.27) runs on a 910B today
  ascend    upstream 0.2.40: npu_rotary_mul, coefficients rebuilt every call

Per call of the backend's implementation, at model shapes: kernels (ops on
npu tensors that make new data, ``VIEW_OPS`` left out, the fused ops and
dtype casts counted) and the bytes they read and write (seen by a
``TorchDispatchMode``), peak device bytes above the inputs, and cosine /
max abs error against eager on the CPU. Host µs per call at a tiny shape (the bed computes
on the host, so large shapes would time host arithmetic a 910B does not do).
On the bed these are counts of what the device is asked to do, not 910B times.

    python benchmarks/rope.py [--repeat 200] [--json]
"""

import argparse
import collections
import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
from testbed.device_work import VIEW_OPS  # noqa: E402

KITCHEN = "0.2.40"
TAG = "@@rope "
CONTENDERS = ("shim", "eager", "ascend")
BACKENDS = {"shim": "ascend_shim_rope", "eager": "eager", "ascend": "ascend"}
def _freqs(torch, positions, pairs, heads_axis=False):
    angle = torch.rand(positions, pairs) * 100
    m = torch.stack([angle.cos(), -angle.sin(), angle.sin(), angle.cos()], -1).reshape(positions, pairs, 2, 2)
    return m.reshape(1, positions, 1, pairs, 2, 2) if heads_axis else m.reshape(1, 1, positions, pairs, 2, 2)


def cases(torch, length, d=128, heads=24):
    bf16 = torch.bfloat16
    f = _freqs(torch, length, d // 2)
    x = torch.randn(1, heads, length, d).to(bf16)
    k = torch.randn(1, heads, length, d).to(bf16)
    scale = (torch.rand(d) + 0.5).to(bf16)
    return [
        ("Flux apply_rope", "apply_rope", dict(xq=x, xk=k, freqs_cis=f)),
        ("LTX apply_rope_split_half", "apply_rope_split_half", dict(xq=x, xk=k, freqs_cis=f)),
        ("Lumina2 rms_rope (BSND)", "rms_rope", dict(
            q=x.transpose(1, 2).contiguous(), k=k.transpose(1, 2).contiguous(),
            freqs_cis=_freqs(torch, length, d // 2, heads_axis=True), q_scale=scale)),
        ("MiniMax-H3 rms_rope_split_half rot_dim=64", "rms_rope_split_half", dict(
            q=x, k=k, freqs_cis=_freqs(torch, length, d // 4), q_scale=scale, rot_dim=d // 2)),
    ]


def worker(repeat):
    import warnings

    import torch
    import torch_npu

    import harness
    from testbed import torch_ops_packets

    library = torch_ops_packets.serve_from_file(  # noqa: F841  (kept alive)
        torch_npu, harness.torch_npu_dir("2.12.0") / "registered_schemas.txt")
    import comfy_kitchen as ck
    from testbed import npu_device

    warnings.simplefilter("ignore")
    registry = ck.registry
    npu = torch.device("npu", 0)
    torch.manual_seed(0)

    def on_npu(kwargs):
        return {k: v.to(npu) if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()}

    def flat(result):
        return torch.cat([r.detach().cpu().double().reshape(-1) for r in (
            result if isinstance(result, tuple) else (result,))])

    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_flatten

    class Traffic(TorchDispatchMode):
        """Kernels (ops that make new data) and the bytes they read and write."""

        def __init__(self):
            super().__init__()
            self.kernels, self.bytes, self.names = 0, 0, collections.Counter()

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            name = func._schema.name.split("::")[-1]
            made = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]
            if made and name not in VIEW_OPS:  # promote_types and the like make no tensor
                tensors = [t for t in tree_flatten((args, kwargs, out))[0] if isinstance(t, torch.Tensor)]
                self.kernels += 1
                self.names[name] += 1
                self.bytes += sum(t.numel() * t.element_size() for t in tensors)
            return out

    def counted(function, kwargs, backend):
        # the backend's implementation itself: kitchen's custom-op wrapper would hide its ops
        impl = registry.get_implementation(function, backend=backend)
        before = npu_device.memory_allocated()
        npu_device.reset_peak_memory_stats()
        with Traffic() as traffic:
            out = impl(**kwargs)
        peak = npu_device.max_memory_allocated() - before
        return out, traffic.kernels, peak, traffic.bytes, dict(traffic.names)

    rows = []
    for label, function, kwargs in cases(torch, 1024):
        want = flat(getattr(ck, function)(**kwargs))  # eager on the CPU
        device_kwargs = on_npu(kwargs)
        row = {"case": label, "function": function}
        for name in CONTENDERS:
            backend = BACKENDS[name]
            if function not in registry.list_backends().get(backend, {}).get("capabilities", ()):
                row[name] = None
                continue
            try:
                counted(function, device_kwargs, backend)  # cold: builds and caches coefficients
                out, kernels, peak, traffic, names = counted(function, device_kwargs, backend)
            except Exception as exc:
                row[name] = {"error": "%s: %s" % (type(exc).__name__, str(exc)[:120])}
                continue
            got = flat(out)
            row[name] = {"kernels": kernels, "ops": names, "bytes": traffic, "peak_bytes": peak,
                         "cos": torch.nn.functional.cosine_similarity(got, want, dim=0).item(),
                         "max_abs": (got - want).abs().max().item()}
        rows.append(row)
    # host µs per call at a tiny shape
    host = {}
    for label, function, kwargs in cases(torch, 16, d=64, heads=2):
        device_kwargs = on_npu(kwargs)
        host[label] = {}
        for name in CONTENDERS:
            backend = BACKENDS[name]
            if function not in registry.list_backends().get(backend, {}).get("capabilities", ()):
                continue
            fn = getattr(ck, function)
            with registry.use_backend(backend):
                for _ in range(10):
                    fn(**device_kwargs)
                samples = []
                for _ in range(repeat):
                    start = time.perf_counter()
                    fn(**device_kwargs)
                    samples.append(time.perf_counter() - start)
            samples.sort()
            host[label][name] = samples[len(samples) // 2] * 1e6
    from ascend_shim.kitchen import rope

    print(TAG + json.dumps({"rows": rows, "host_us": host, "report": rope.report()}))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=200)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    options = parser.parse_args()
    if options.worker:
        return worker(options.repeat)
    import harness

    env = harness.bed_env("ascend-cu130", kitchen=KITCHEN, extra_path=(str(REPO),),
                          ASCEND_SHIM_INT8="shim", OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, __file__, "--worker", "--repeat", str(options.repeat)],
                          env=env, capture_output=True, text=True, timeout=1800, cwd=str(REPO))
    lines = [line for line in proc.stdout.splitlines() if line.startswith(TAG)]
    if not lines:
        sys.stderr.write(proc.stderr[-4000:])
        return 1
    result = json.loads(lines[-1][len(TAG):])
    if options.json:
        print(json.dumps(result, indent=1))
        return 0
    print("per call: kernels / device MiB read+written / peak MiB above inputs / cosine, max abs vs eager "
          "(CPU); kitchen %s, bf16, B=1, L=1024, D=128, 24 heads" % KITCHEN)
    print("| case | shim | eager | upstream ascend |")
    print("|---|---|---|---|")
    for row in result["rows"]:
        cells = []
        for name in CONTENDERS:
            c = row[name]
            cells.append("n/a" if c is None else c["error"] if "error" in c else
                         "%d k, %.0f MiB, peak %.0f MiB, cos %.7f, max %.2g" % (
                             c["kernels"], c["bytes"] / 2 ** 20, c["peak_bytes"] / 2 ** 20, c["cos"], c["max_abs"]))
        print("| %s | %s |" % (row["case"], " | ".join(cells)))
    print("\nhost µs per call (median, tiny shape 1x2x16x64)")
    print("| case | shim | eager | upstream ascend |")
    print("|---|---:|---:|---:|")
    for label, times in result["host_us"].items():
        print("| %s | %s |" % (label, " | ".join("%.0f" % times[n] if n in times else "n/a" for n in CONTENDERS)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
