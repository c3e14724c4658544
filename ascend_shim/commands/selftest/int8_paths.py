"""The product's INT8 backend on the device: the matrix of ``int8_linear`` calls.

Each case runs through the production ``Int8Backend`` (``kitchen/backend``),
built as registration builds it but on a ``RecordingOps``: ``serve_quant``
for the NPU path (where ``ascend_shim``'s ``int8_linear`` ends once the
call is accepted) and ``fallback_int8_linear`` (``ascend_shim_fallback``'s
entry point). The output and every recorded device call are then checked
against the float64 reference.
"""

import dataclasses
from typing import Any, Optional

import torch

from ascend_shim.commands.selftest import checks, reference
from ascend_shim.commands.selftest.cases import KITCHEN_ABSENT, Case, make_inputs, quantized_weight
from ascend_shim.commands.selftest.recording import RecordingOps, describe, describe_call
from ascend_shim.kitchen import contract
from ascend_shim.kitchen.backend import Int8Backend, KitchenFeatures


@dataclasses.dataclass(frozen=True)
class NoKitchenFeatures:
    """``KitchenFeatures`` where no comfy-kitchen is installed: no input_act, no ConvRot."""

    version: Optional[str] = None
    apply_input_act: Any = None
    input_acts: frozenset = frozenset({None})
    act_takes_weight: bool = False
    build_hadamard: Any = None
    rotate_activation: Any = None
    convrot_missing: Optional[str] = "comfy-kitchen is not installed"
    call_rules: bool = False


def kitchen_features() -> Any:
    """What the installed comfy-kitchen offers the backend, as registration reads it."""
    try:
        import comfy_kitchen as ck

        return KitchenFeatures(ck)
    except (ImportError, AttributeError):
        return NoKitchenFeatures()


def has_convrot(backend: Int8Backend) -> bool:
    return backend.features.rotate_activation is not None


def product_backend(torch_npu: Any) -> Int8Backend:
    """The shim's ``Int8Backend``, its device calls recorded (``backend.ops.calls``).

    No registry: a call that would go to eager is skipped (``skip_reason``).
    """
    return Int8Backend(kitchen_features(), RecordingOps(torch_npu), registry=None)


def case_kwargs(case: Case, x, weight, weight_scale, bias) -> dict:
    return dict(x=x, weight=weight, weight_scale=weight_scale, bias=bias,
                out_dtype=getattr(torch, case.out_dtype), convrot=bool(case.convrot),
                convrot_groupsize=case.convrot or 256)


def skip_reason(backend: Int8Backend, case: Case, kwargs: dict) -> Optional[str]:
    """Why the product would not run ``case`` on this path, or None."""
    if case.convrot and not has_convrot(backend):
        return KITCHEN_ABSENT  # ConvRot's Hadamard rotation is kitchen's
    call = contract.int8_linear_call(**kwargs)
    if case.path == "npu":
        declined = contract.check(call, backend.features.input_acts)
    else:
        declined = backend.fallback_decline(call)
    return "the shim declines this call (%s: %s)" % declined if declined else None


def serve(backend: Int8Backend, case: Case, kwargs: dict) -> torch.Tensor:
    if case.path == "fallback":
        return backend.fallback_int8_linear(**kwargs)
    return backend.serve_quant(contract.int8_linear_call(**kwargs))


def run_case(backend: Int8Backend, device: torch.device, case: Case, seed: int) -> dict:
    x, weight, weight_scale, bias = make_inputs(case, device, seed)
    kwargs = case_kwargs(case, x, weight, weight_scale, bias)
    result: dict[str, Any] = {"name": case.name, "path": case.path}
    skipped = skip_reason(backend, case, kwargs)
    if skipped:
        result.update(passed=True, skipped=skipped)
        return result
    ops = backend.ops
    ops.calls = []
    out, error = None, None
    try:
        out = serve(backend, case, kwargs)
    except Exception as exc:
        error = "%s: %s" % (type(exc).__name__, exc)
    error = ops.first_error() or error  # the product falls back on a refused call: a failure here
    calls = [describe_call(c) for c in ops.calls] or [fallback_call(kwargs)]
    if error is not None or out is None:
        result.update(passed=False, failures=["the call raised %s" % error], calls=calls)
        return result
    metrics, failures = case_checks(case, out, kwargs, ops.calls)
    result.update(metrics)
    result.update(passed=not failures, failures=failures, calls=calls)
    return result


def case_checks(case: Case, out: torch.Tensor, kwargs: dict, calls: list) -> checks.Checked:
    """(metrics, failures) of one matrix case: its output, its device calls, the layer."""
    x, weight, weight_scale, bias = (kwargs[k] for k in ("x", "weight", "weight_scale", "bias"))
    failures = checks.output_failures(out, x, weight.shape[0], kwargs["out_dtype"])
    if failures:
        return {}, failures
    if case.path == "fallback":
        return checks.fallback_check(out, x, weight, weight_scale, bias)
    metrics, failures = checks.device_call_checks(calls)
    e2e, e2e_failures = checks.end_to_end(out, reference.float_linear(x, weight, weight_scale, bias,
                                                                       case.convrot))
    metrics.update(e2e)
    return metrics, failures + e2e_failures


def fallback_call(kwargs: dict) -> dict:
    """The on-device fallback described like a device call (it is a float linear)."""
    names = ("x", "weight", "weight_scale", "bias", "out_dtype")
    return {"call": "ascend_shim.npu_math.int8.dequantized_linear",
            "arguments": {name: describe(kwargs[name]) for name in names}}


def report_check(ops: Any, device: torch.device) -> dict:
    """The call from the original report, on ``ops`` (torch_npu): bf16 activations, int8
    weight; checks shape, dtype and device."""
    x = torch.randn(128, 2048, dtype=torch.bfloat16, device=device)
    w = torch.randint(-127, 128, (2048, 2048), dtype=torch.int8, device=device)
    scale = torch.full((2048,), 0.01, dtype=torch.float32, device=device)
    x8, x_scale = ops.npu_dynamic_quant(x)
    y = ops.npu_quant_matmul(x8, w.t(), scale, pertoken_scale=x_scale.reshape(-1).float(),
                             output_dtype=torch.bfloat16)
    ok = tuple(y.shape) == (128, 2048) and y.dtype == torch.bfloat16 and y.device.type == "npu"
    return {"name": "dynamic quant + quant matmul", "shape": list(y.shape), "dtype": str(y.dtype),
            "device": str(y.device), "passed": ok}


def kitchen_check(device: torch.device) -> dict:
    """Through comfy-kitchen's dispatch: which backend served, and how close."""
    try:
        import comfy_kitchen as ck
    except ImportError:
        return {"name": "comfy-kitchen int8_linear", "passed": True, "skipped": KITCHEN_ABSENT}
    if not hasattr(ck, "int8_linear"):
        return {"name": "comfy-kitchen int8_linear", "passed": True, "note": "this kitchen has no int8_linear"}
    q, scale = quantized_weight(256, 1024, device)
    x = torch.randn(32, 1024, dtype=torch.bfloat16, device=device)
    kwargs = dict(x=x, weight=q, weight_scale=scale, bias=None, out_dtype=torch.bfloat16)
    backend = ck.registry.get_capable_backend("int8_linear", kwargs)
    out = ck.int8_linear(x, q, scale, None, torch.bfloat16)
    result: dict[str, Any] = {"name": "comfy-kitchen int8_linear", "backend": backend}
    metrics, failures = checks.end_to_end(out, reference.float_linear(x, q, scale, None, 0))
    result.update(metrics)
    result["passed"] = backend != "eager" and not failures
    return result
