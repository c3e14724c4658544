"""``python -m ascend_shim selftest``: is this NPU right about every call the shim makes?

The only check of the project that runs on a real 910B. It runs the
product itself on the device: the shim's INT8 backend (``kitchen/backend``)
on each distinct call it makes in production (``cases.matrix()``: output
and bias dtypes, weight-scale shapes, 2-D/3-D and strided activations,
M = 1 / odd / past a tile, K and N off the 16-grid, a zero row, ConvRot,
the on-device fallback), then the shim's further paths (``paths``: the
``aten::_int_mm`` kernel, W4A8, the fp8 decode) and comfy-kitchen's own
dispatch of ``int8_linear``. Each is checked twice against a float64
reference that shares no code with the product (``reference``):

* the device's arithmetic: the backends run on a ``RecordingOps`` in place
  of ``torch_npu``; every call is recorded with its arguments and results
  and recomputed in float64 on the CPU from exactly those tensors;
* the shim's result end to end against the float64 layer on the original
  inputs (thresholds in ``checks``).

A failing case lists each device call with its arguments (shapes, dtypes,
strides, keywords) and the versions of torch, torch_npu and CANN, ready to
paste into a bug report; ``--json`` gives the same as JSON.

Exit status: 0 passed, 1 failed, 3 no NPU here.
"""

import argparse
import warnings
from typing import Any, Callable

from ascend_shim.cli import json_report as _json_report

PASSED = 0
FAILED = 1
NO_NPU = 3


def guarded(name: str, checks: Callable[[], list]) -> list:
    """``checks()``, or one failed check named ``name`` with what it raised."""
    try:
        return checks()
    except Exception as exc:
        return [{"name": name, "passed": False, "failures": ["raised %s: %s" % (type(exc).__name__, exc)]}]


def _fallbacks(caught: list) -> list[str]:
    from ascend_shim.engine.fallback_report import PATTERN

    return sorted({m.group(1) for w in caught for m in [PATTERN.search(str(w.message))] if m})


def device_checks(torch_npu: Any, device: Any) -> list[dict]:
    """Every check on ``device``, the product's backends on recorded ops."""
    from ascend_shim.commands.selftest import cases, int8_paths, paths

    checks = guarded("dynamic quant + quant matmul", lambda: [int8_paths.report_check(torch_npu, device)])
    backend = int8_paths.product_backend(torch_npu)
    for seed, case in enumerate(cases.matrix()):
        checks.append(int8_paths.run_case(backend, device, case, seed))
    for extra in paths.EXTRA_CHECKS:
        checks += guarded(extra.__name__, lambda: extra(device, backend))
    checks += guarded("comfy-kitchen int8_linear", lambda: [int8_paths.kitchen_check(device)])
    return checks


def run() -> dict:
    from ascend_shim.engine import fallback_report
    from ascend_shim.engine.npu import npu_reason

    reason = npu_reason()
    if reason:
        return {"npu": False, "reason": reason, "checks": [], "passed": False}
    import torch
    import torch_npu

    from ascend_shim.commands.selftest import report

    torch.manual_seed(0)
    device = torch.device("npu", torch.npu.current_device())  # type: ignore[attr-defined]  # torch_npu's
    # torch_npu's fallback warning is a C++ line on stderr, not a Python warning
    with warnings.catch_warnings(record=True) as caught, fallback_report.native_fallbacks() as native:
        warnings.simplefilter("always")
        checks = device_checks(torch_npu, device)
        torch.npu.synchronize()  # type: ignore[attr-defined]
    fallbacks = sorted(set(_fallbacks(caught)) | set(native))
    checks.append({"name": "no CPU fallback", "fallbacks": fallbacks, "passed": not fallbacks})
    info = report.versions(torch, torch_npu, device)
    from ascend_shim.cli.hardware import emulation

    info["emulated"] = emulation(torch, device)
    return {"npu": True, "device": info["device"], "torch_npu": info["torch_npu"], "versions": info,
            "checks": checks, "passed": all(c["passed"] for c in checks),
            "not_checked": report.not_checked(checks)}


def main(options: argparse.Namespace) -> int:
    result = run()
    if options.json:
        _json_report.emit(result)
    elif not result["npu"]:
        print("selftest needs an Ascend NPU: %s" % result["reason"])
    else:
        from ascend_shim.commands.selftest.report import text_report

        print(text_report(result, getattr(options, "verbose", False)))
    if not result["npu"]:
        return NO_NPU
    return PASSED if result["passed"] else FAILED
