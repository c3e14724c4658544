"""Checks: a result of the product against the float64 reference, as (metrics, failures).

Thresholds:
* ``npu_dynamic_quant``: codes within one of round-half-even, at most
  ``CODE_OFF_BY_ONE_MAX`` of them off by one, scales to ``SCALE_RTOL``;
* ``npu_quant_matmul``: each element within the output dtype's epsilon
  relative (one to two units in the last place) plus a few fp32 roundings
  of the terms (``FP32_TERMS``), so a dropped or doubled scale, an ignored
  bias or a wrong row or column fails while the op's one rounding passes;
* end to end: cosine >= ``COSINE_MIN`` and relative MAE <= ``REL_MAE_MAX``.
  INT8 activations cost about 0.7 % relative RMS (step max|x|/127 over a
  row, error step/sqrt(12)); the bounds leave a factor of two.
"""

from typing import Any, Callable

import torch

from ascend_shim.commands.selftest.recording import Call
from ascend_shim.commands.selftest.reference import f64, float_linear

COSINE_MIN = 0.9999
REL_MAE_MAX = 0.02
# |out - ref| <= eps(out) * |ref| + FP32_TERMS * (|acc*scale*pertoken| + |bias|):
# one rounding to the output dtype plus a few fp32 roundings, with 4x margin
FP32_TERMS = 2.0 ** -20
CODE_OFF_BY_ONE_MAX = 0.01  # fp32 multiply vs exact division: ~0.04 % of codes
SCALE_RTOL = 1e-5
ZERO_SCALE_ATOL = 1e-20  # a zero row's scale may be 0 or a tiny floor

Checked = tuple[dict[str, Any], list[str]]


def compare(out: torch.Tensor, reference: torch.Tensor) -> dict[str, float]:
    """Cosine and relative MAE of ``out`` against ``reference``."""
    o = f64(out).reshape(-1)
    r = f64(reference).reshape(-1)
    if not torch.isfinite(o).all():
        return {"cosine": float("nan"), "rel_mae": float("inf")}
    return {"cosine": torch.nn.functional.cosine_similarity(o, r, dim=0).item(),
            "rel_mae": ((o - r).abs().mean() / r.abs().mean()).item()}


def end_to_end(out: torch.Tensor, reference: torch.Tensor) -> Checked:
    metrics = compare(out, reference)
    failures = []
    if not metrics["cosine"] >= COSINE_MIN:
        failures.append("cosine %.6f < %s against the float64 layer" % (metrics["cosine"], COSINE_MIN))
    if not metrics["rel_mae"] <= REL_MAE_MAX:
        failures.append("relative MAE %.4f > %s against the float64 layer" % (metrics["rel_mae"], REL_MAE_MAX))
    return dict(metrics), failures


def output_failures(out: torch.Tensor, x: torch.Tensor, n: int, out_dtype: torch.dtype) -> list[str]:
    """The output's shape, dtype and device are those of the layer's."""
    expected = (list(x.shape[:-1]) + [n], out_dtype, x.device)
    got = (list(out.shape), out.dtype, out.device)
    if got != expected:
        return ["output %s %s on %s, expected %s %s on %s" % (got + expected)]
    return []


def dynamic_quant_check(call: Call) -> Checked:
    """``npu_dynamic_quant`` against round-half-even of x * 127 / max|x| per row, in float64."""
    x = f64(call.args[0])
    codes, scale = call.result
    failures = []
    if codes.dtype != torch.int8 or tuple(codes.shape) != tuple(x.shape):
        failures.append("codes %s %s, expected torch.int8 %s" % (codes.dtype, list(codes.shape), list(x.shape)))
    if scale.dtype != torch.float32 or tuple(scale.shape) != tuple(x.shape[:-1]):
        failures.append("scale %s %s, expected torch.float32 %s"
                        % (scale.dtype, list(scale.shape), list(x.shape[:-1])))
    if failures:
        return {}, failures
    amax = x.abs().amax(dim=-1)
    inv = torch.where(amax > 0, 127.0 / amax, torch.zeros_like(amax))
    diff = (f64(codes) - torch.round(x * inv.unsqueeze(-1))).abs()
    expected_scale = amax / 127.0
    scale_err = (f64(scale) - expected_scale).abs()
    scale_ok = torch.isfinite(f64(scale)) & (scale_err <= SCALE_RTOL * expected_scale + ZERO_SCALE_ATOL)
    metrics = {"codes_max_diff": int(diff.max().item()),
               "codes_off_by_one": (diff == 1).double().mean().item(),
               "scale_max_rel_err": (scale_err / expected_scale.clamp(min=1e-30)).max().item()}
    if metrics["codes_max_diff"] > 1:
        failures.append("npu_dynamic_quant codes differ by up to %d from round(x*127/max|x|)"
                        % metrics["codes_max_diff"])
    if metrics["codes_off_by_one"] > CODE_OFF_BY_ONE_MAX:
        failures.append("npu_dynamic_quant: %.1f%% of codes off by one (allowed %.0f%%)"
                        % (100 * metrics["codes_off_by_one"], 100 * CODE_OFF_BY_ONE_MAX))
    if not scale_ok.all():
        row = int((~scale_ok).reshape(-1).nonzero()[0].item())
        failures.append("npu_dynamic_quant scale of row %d is %r, expected max|x|/127 = %r"
                        % (row, f64(scale).reshape(-1)[row].item(), expected_scale.reshape(-1)[row].item()))
    return metrics, failures


def quant_matmul_check(call: Call) -> Checked:
    """``npu_quant_matmul`` against acc * scale * pertoken + bias in float64 from its own inputs."""
    x1, x2, scale = call.args[:3]
    pertoken, bias = call.kwargs.get("pertoken_scale"), call.kwargs.get("bias")
    out_dtype = call.kwargs.get("output_dtype")
    out = call.result
    if out.dtype != out_dtype:
        return {}, ["npu_quant_matmul returned %s, asked for %s" % (out.dtype, out_dtype)]
    scaled = (f64(x1) @ f64(x2)) * f64(scale)
    if pertoken is not None:
        scaled = scaled * f64(pertoken).unsqueeze(-1)
    float_bias = f64(bias) if bias is not None else torch.zeros((), dtype=torch.float64)
    reference = scaled + float_bias
    if not torch.isfinite(reference).all():
        return {}, ["npu_quant_matmul was given non-finite scales or bias"]
    if tuple(out.shape) != tuple(reference.shape):
        return {}, ["npu_quant_matmul returned shape %s, expected %s" % (list(out.shape), list(reference.shape))]
    info = torch.finfo(out_dtype)
    allowed = info.eps * reference.abs() + FP32_TERMS * (scaled.abs() + float_bias.abs()) + info.tiny
    ratio = torch.nan_to_num((f64(out) - reference).abs() / allowed, nan=float("inf"))
    worst = int(ratio.reshape(-1).argmax().item())
    row, column = divmod(worst, reference.shape[-1])
    metrics = {"qmm_max_err_ratio": ratio.max().item()}
    if not metrics["qmm_max_err_ratio"] <= 1.0:
        return metrics, ["npu_quant_matmul off by %.3g times the rounding bound; worst at row %d column %d: "
                         "%r, expected %r" % (metrics["qmm_max_err_ratio"], row, column,
                                              f64(out).reshape(-1)[worst].item(),
                                              reference.reshape(-1)[worst].item())]
    return metrics, []


CALL_CHECKS: dict[str, Callable[[Call], Checked]] = {
    "npu_dynamic_quant": dynamic_quant_check, "npu_quant_matmul": quant_matmul_check}


def device_call_checks(calls: list[Call]) -> Checked:
    """Every recorded quant call checked on its own inputs."""
    metrics: dict[str, Any] = {}
    failures: list[str] = []
    raised = [c for c in calls if c.error is not None]
    if raised:
        return metrics, ["torch_npu.%s raised %s" % (c.op, c.error) for c in raised]
    for call in calls:
        checker = CALL_CHECKS.get(call.op)
        if checker is not None:
            found, failed = checker(call)
            metrics.update(found)
            failures.extend(failed)
    missing = [op for op in CALL_CHECKS if op not in {c.op for c in calls}]
    if missing:
        failures.append("the INT8 path made no %s call" % " and no ".join(missing))
    return metrics, failures


def fallback_check(out: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor,
                   bias) -> Checked:
    """The dequantized linear: within GEMM rounding in x's dtype of the float64 layer."""
    reference = float_linear(x, weight, weight_scale, bias, 0)
    scale = f64(weight_scale).reshape(-1)
    w = f64(weight).abs() * (scale.reshape(-1, 1) if scale.numel() > 1 else scale).abs()
    terms = f64(x).abs() @ w.t() + (0 if bias is None else f64(bias).abs())
    # a GEMM no coarser than x's dtype (inputs and result rounded), one rounding of the output
    allowed = torch.finfo(x.dtype).eps * terms + torch.finfo(out.dtype).eps * reference.abs()
    ratio = torch.nan_to_num((f64(out) - reference).abs() / allowed, nan=float("inf"))
    metrics = {"gemm_max_err_ratio": ratio.max().item()}
    if not metrics["gemm_max_err_ratio"] <= 1.0:
        return metrics, ["dequantized linear off by %.3g times the GEMM rounding bound"
                         % metrics["gemm_max_err_ratio"]]
    return metrics, []


def int_mm_check(out: torch.Tensor, expected: torch.Tensor, device: torch.device) -> Checked:
    """A device ``_int_mm`` bit-exact against the CPU's."""
    got = out.detach().to("cpu")
    if got.dtype != torch.int32 or got.shape != expected.shape or out.device != device:
        return {}, ["output %s %s on %s, expected torch.int32 %s on %s"
                    % (got.dtype, list(got.shape), out.device, list(expected.shape), device)]
    wrong = got != expected
    metrics: dict[str, Any] = {"mismatches": int(wrong.sum().item())}
    if not metrics["mismatches"]:
        return metrics, []
    metrics["max_abs_diff"] = int((got.long() - expected.long()).abs().max().item())
    return metrics, ["%d of %d elements differ from CPU torch._int_mm (max |diff| %d)"
                     % (metrics["mismatches"], wrong.numel(), metrics["max_abs_diff"])]


def fp8_decode_check(plain: torch.Tensor, scaled: torch.Tensor, expected: torch.Tensor, scale: torch.Tensor
                     ) -> Checked:
    """Every code decoded exactly in bf16; with a per-row scale, within one bf16 rounding."""
    failures = []
    got = f64(plain)
    finite = torch.isfinite(expected)
    same = torch.where(finite, got == expected, torch.isnan(expected) & torch.isnan(got) | (got == expected))
    metrics: dict[str, Any] = {"mismatches": int((~same).sum().item())}
    if plain.dtype != torch.bfloat16 or metrics["mismatches"]:
        bad = int((~same).reshape(-1).nonzero()[0].item()) if metrics["mismatches"] else 0
        failures.append("decode without scale: %s, %d of 256 codes differ (code 0x%02x gave %r, its value is %r)"
                        % (plain.dtype, metrics["mismatches"], bad, got.reshape(-1)[bad].item(),
                           expected.reshape(-1)[bad].item()))
    reference = expected * f64(scale)
    allowed = torch.finfo(torch.bfloat16).eps * reference.abs()
    ratio = ((f64(scaled) - reference).abs() / allowed.clamp(min=torch.finfo(torch.float32).tiny))[finite]
    metrics["scaled_max_err_ratio"] = ratio.max().item()
    if not metrics["scaled_max_err_ratio"] <= 1.0:
        failures.append("decode with a per-row scale off by %.3g times one bf16 rounding"
                        % metrics["scaled_max_err_ratio"])
    return metrics, failures
