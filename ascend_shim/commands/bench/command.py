"""``python -m ascend_shim bench``: per-layer latency, bf16 linear vs the shim's INT8 path.

On an NPU it also times the two arithmetics of the shim's ``_int_mm`` kernel
side by side: the INT8 cube (``npu_quant_matmul`` int32 output) and fp32
GEMMs over K-chunks, and says whether they agree bit for bit.

It also times npu_quant_matmul alone with the INT8 weight as its
``.t()`` view (what the shim passes), contiguous, and cast to FRACTAL_NZ
(``npu_format_cast(w, 29)``, vllm-ascend's default), side by side: nothing
changes by default, the table is for a user to measure and paste. Then
uni_pc's and sa_solver's ``linalg.solve`` and ``lgamma`` through the shim's
kernels beside the host round trip torch_npu's CPU fallback makes. Last,
comfy-kitchen's eager RoPE against the shim's fused one (``rope``), and torch's RMSNorm and
kitchen's SwiGLU chains against npu_rms_norm / npu_swiglu (``fused``).

Layer shapes follow the real layers measured in comfy-kitchen PR #153
(Z-Image Turbo, M=8352) plus a small M. Each timing: warm-up, then
``repeat`` runs with device synchronisation, median in ms. Without an NPU
only the host-side part (the Python around the two kernels) is timed, the
output says so, and the exit status is 3 (no NPU), as for ``selftest``.

An *emulated* NPU (its tensors are a Python tensor subclass, so every op runs
on the host CPU, as on the simulated test bed) is timed too, but its numbers
are labelled as the emulation's, and its default run is short (one token
count, one timed run): they say nothing about a 910B.

Sizes the device cannot hold are refused before anything runs (exit 2).
Progress goes to stderr, one line per measurement, with the time left.
"""

from typing import Any

from ascend_shim.cli import json_report as _json_report
from ascend_shim.commands.bench import fused as bench_fused
from ascend_shim.commands.bench import layers
from ascend_shim.commands.bench import rope as bench_rope
from ascend_shim.commands.bench.timing import NO_NPU, USAGE, device_setup, median_ms, progress


def _no_torch(options: Any, exc: BaseException) -> int:
    reason = "bench needs torch: %s: %s" % (type(exc).__name__, exc)
    if options.json:
        _json_report.emit({"npu": False, "reason": reason, "emulated": None, "rows": []})
    else:
        print(reason)
    return NO_NPU


def main(options: Any) -> int:
    kit = [flag for flag, value in (("--real-size", getattr(options, "real_size", None)),
                                    ("--hccl", getattr(options, "hccl", None))) if value is not None]
    misplaced = [flag for flag, given in (("--m", options.m is not None),
                                          ("--tiny", getattr(options, "tiny", False)),
                                          ("--step-seconds", getattr(options, "step_seconds", None) is not None))
                 if given]
    if len(kit) > 1 or (kit and "--m" in misplaced) or (not kit and "--tiny" in misplaced) or \
            ("--step-seconds" in misplaced and kit != ["--hccl"]):
        from ascend_shim.startup import output as _output

        _output.write("bench: %s: give --real-size or --hccl (either with --tiny; --step-seconds with --hccl), "
                      "or --m, one at a time"
                      % " with ".join(kit + misplaced))
        return USAGE
    if kit == ["--real-size"]:
        from ascend_shim.commands.bench import calibration

        return calibration.run(options)
    if kit == ["--hccl"]:
        from ascend_shim.commands.bench import hccl as bench_hccl

        return bench_hccl.run(options)
    try:
        import torch
    except Exception as exc:  # not installed, or torch_npu's autoload breaks it
        return _no_torch(options, exc)
    from ascend_shim.engine.npu import npu_reason

    reason = npu_reason()
    setup = device_setup(torch, reason)
    device, emulated = setup[0], setup[3]
    repeat, warmup, m_values = layers.EMULATED_DEFAULTS if emulated else layers.DEFAULTS
    repeat = options.repeat if options.repeat is not None else repeat
    warmup = options.warmup if options.warmup is not None else warmup
    m_values = options.m if options.m is not None else m_values
    refused = layers.too_big(m_values, torch, device, emulated)
    if refused:
        from ascend_shim.startup import output as _output

        _output.write("bench: %s" % refused)
        return USAGE
    result = layers.run(m_values, repeat, warmup, setup, reason)
    if result["npu"]:
        progress("now the weight layouts")
        result["weight_layouts"] = layers.weight_layouts(m_values, repeat, warmup, setup)
        progress("now RoPE")
        result["rope"], result["rope_not_timed"] = bench_rope.rope_rows(
            torch, device, setup[1], max(m_values), lambda f: median_ms(f, setup[2], warmup, repeat))
        progress("now RMSNorm and SwiGLU")
        result["fused"], result["fused_not_timed"] = bench_fused.fused_rows(
            torch, device, setup[1], max(m_values), lambda f: median_ms(f, setup[2], warmup, repeat))
    if options.json:
        _json_report.emit(result)
        return 0 if result["npu"] else NO_NPU
    if result["npu"]:
        layers.print_device_table(result)
        layers.print_layout_table(result["weight_layouts"], result["emulated"])
        bench_rope.print_rope_table(result["rope"], result["rope_not_timed"], result["emulated"])
        bench_fused.print_fused_table(result["fused"], result["fused_not_timed"], result["emulated"])
        progress("done")
        return 0
    print("no NPU here (%s): host overhead only, device kernels excluded" % result["reason"])
    print("| layer | M | K | N | host ms per call |")
    print("|---|---:|---:|---:|---:|")
    for r in result["rows"]:
        print("| %s | %d | %d | %d | %.4f |" % (r["layer"], r["M"], r["K"], r["N"], r["int8_ms"]))
    return NO_NPU
