"""``python -m ascend_shim bench``: per-layer latency, bf16 linear vs the shim's INT8 path.

Layer shapes follow the real layers measured in comfy-kitchen PR #153
(Z-Image Turbo, M=8352) plus a small M. Each timing: warm-up, then
``repeat`` runs with device synchronisation, median in ms. Without an NPU
only the host-side part (the Python around the two kernels) is timed, the
output says so, and the exit status is 3 (no NPU), as for ``selftest``.
Progress goes to stderr, one line per measurement.
"""

import json
import statistics
import sys
import time

NO_NPU = 3

LAYERS = (("attention out", 3840, 3840), ("QKV", 3840, 11520),
          ("FFN up (w1)", 3840, 10240), ("FFN down (w2)", 10240, 3840))


def _median_ms(function, sync, warmup, repeat):
    for _ in range(warmup):
        function()
    sync()
    samples = []
    for _ in range(repeat):
        start = time.perf_counter()
        function()
        sync()
        samples.append((time.perf_counter() - start) * 1000.0)
    return statistics.median(samples)


class _HostOnly:
    """Stand-in ops with the real output shapes and no arithmetic: times the host path."""

    def __init__(self, torch):
        self.torch = torch

    def npu_dynamic_quant(self, x):
        return (self.torch.empty(x.shape, dtype=self.torch.int8),
                self.torch.empty(x.shape[:-1], dtype=self.torch.float32))

    def npu_quant_matmul(self, x1, x2, scale, *, pertoken_scale=None, bias=None, output_dtype=None):
        return self.torch.empty((x1.shape[0], x2.shape[1]), dtype=output_dtype)


def _progress(text):
    if sys.stderr is not None:
        try:
            sys.stderr.write("bench: %s\n" % text)
            sys.stderr.flush()
        except Exception:
            pass


def run(m_values, repeat, warmup):
    from ascend_shim._npu import npu_reason

    reason = npu_reason()
    import torch

    from ascend_shim.kitchen import int8_math

    rows = []
    if reason is None:
        import torch_npu

        device = torch.device("npu", torch.npu.current_device())
        ops, sync = torch_npu, torch.npu.synchronize
    else:
        device, ops, sync = torch.device("cpu"), _HostOnly(torch), (lambda: None)
    total, done = len(LAYERS) * len(m_values), 0
    for name, k, n in LAYERS:
        weight = torch.randint(-127, 128, (n, k), dtype=torch.int8).to(device)
        scale = torch.rand(n, 1, dtype=torch.float32).to(device) / 100
        dequantized = (weight.float() * scale).to(torch.bfloat16) if reason is None else None
        for m in m_values:
            done += 1
            _progress("%d/%d %s M=%d K=%d N=%d" % (done, total, name, m, k, n))
            x = torch.randn(m, k, dtype=torch.bfloat16).to(device)
            row = {"layer": name, "M": m, "K": k, "N": n}
            row["int8_ms"] = _median_ms(lambda: int8_math.npu_quant_linear(x, weight, scale, None,
                                                                           torch.bfloat16, ops),
                                        sync, warmup, repeat)
            if dequantized is not None:
                row["bf16_ms"] = _median_ms(lambda: torch.nn.functional.linear(x, dequantized), sync,
                                            warmup, repeat)
                row["speedup"] = row["bf16_ms"] / row["int8_ms"]
            rows.append(row)
    return {"npu": reason is None, "reason": reason, "repeat": repeat, "warmup": warmup, "rows": rows}


def main(options):
    try:
        import torch  # noqa: F401
    except Exception as exc:  # not installed, or torch_npu's autoload breaks it
        print("bench needs torch: %s: %s" % (type(exc).__name__, exc))
        return NO_NPU
    result = run(options.m, options.repeat, options.warmup)
    if options.json:
        print(json.dumps(result, indent=2))
        return 0 if result["npu"] else NO_NPU
    if result["npu"]:
        print("| layer | M | K | N | bf16 linear ms | INT8 ms | speed-up |")
        print("|---|---:|---:|---:|---:|---:|---:|")
        for r in result["rows"]:
            print("| %s | %d | %d | %d | %.3f | %.3f | %.2fx |" % (
                r["layer"], r["M"], r["K"], r["N"], r["bf16_ms"], r["int8_ms"], r["speedup"]))
        print("median of %d runs after %d warm-up, device synchronised" % (result["repeat"], result["warmup"]))
    else:
        print("no NPU here (%s): host overhead only, device kernels excluded" % result["reason"])
        print("| layer | M | K | N | host ms per call |")
        print("|---|---:|---:|---:|---:|")
        for r in result["rows"]:
            print("| %s | %d | %d | %d | %.4f |" % (r["layer"], r["M"], r["K"], r["N"], r["int8_ms"]))
        return NO_NPU
    return 0
