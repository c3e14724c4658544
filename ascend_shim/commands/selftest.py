"""``python -m ascend_shim selftest``: is this NPU right about every call the shim makes?

The only check of the project that runs on a real 910B. It makes, on the
device, each distinct call the shim makes in production (the INT8 matrix in
``matrix()``: output and bias dtypes, weight-scale shapes, 2-D/3-D and
strided activations, M = 1 / odd / past a tile, K and N off the 16-grid, a
zero row, ConvRot, the on-device fallback) and checks each one twice:

* the device's arithmetic: every ``torch_npu`` call is recorded with its
  arguments and results, and recomputed in float64 on the CPU from exactly
  those tensors. ``npu_dynamic_quant``: codes within one of round-half-even,
  at most ``CODE_OFF_BY_ONE_MAX`` of them off by one, scales to
  ``SCALE_RTOL``. ``npu_quant_matmul``: each element within the output
  dtype's epsilon relative (one to two units in the last place) plus a few
  fp32 roundings of the terms (``FP32_TERMS``), so a dropped or doubled
  scale, an ignored bias or a wrong row or column fails while the op's one
  rounding passes;
* the shim's result end to end against the float64 linear on the original
  inputs: cosine >= ``COSINE_MIN`` and relative MAE <= ``REL_MAE_MAX``. INT8
  activations cost about 0.7 % relative RMS (step max|x|/127 over a row,
  error step/sqrt(12)); the bounds leave a factor of two.

Then each further path of the shim (``EXTRA_CHECKS``): the ``aten::_int_mm``
kernel bit-exact against CPU ``torch._int_mm`` with
``torch.npu.matmul.allow_hf32`` off and on; W4A8 (int4 codes decoded to int8
on the device bit-exact, its quant calls, the layer against float64); the
host-side fp8 decode of all 256 codes of each float8 format, exact against
the value of its bit fields.

A failing case lists each device call with its arguments (shapes, dtypes,
strides, keywords) and the versions of torch, torch_npu and CANN, ready to
paste into a bug report; ``--json`` gives the same as JSON.

Exit status: 0 passed, 1 failed, 3 no NPU here.
"""

import dataclasses
import platform
import warnings

from ascend_shim.commands import json_report as _json_report
from ascend_shim.commands.text import fill
from ascend_shim.engine.versions import distribution

PASSED = 0
FAILED = 1
NO_NPU = 3

COSINE_MIN = 0.9999
REL_MAE_MAX = 0.02
# |out - ref| <= eps(out) * |ref| + FP32_TERMS * (|acc*scale*pertoken| + |bias|):
# one rounding to the output dtype plus a few fp32 roundings, with 4x margin
FP32_TERMS = 2.0 ** -20
CODE_OFF_BY_ONE_MAX = 0.01  # fp32 multiply vs exact division: ~0.04 % of codes
SCALE_RTOL = 1e-5
ZERO_SCALE_ATOL = 1e-20  # a zero row's scale may be 0 or a tiny floor

# real layer shapes (M, K, N): K past 1024 puts |acc| beyond fp32's exact integers
LAYER_SHAPES = ((64, 3840, 3840), (17, 3840, 1024), (128, 1024, 3840))

KITCHEN_ABSENT = "comfy-kitchen is not installed in this python"

# positional parameter names of the torch_npu calls, for the report
POSITIONAL = {"npu_dynamic_quant": ("input",), "npu_quant_matmul": ("x1", "x2", "scale")}


@dataclasses.dataclass(frozen=True)
class Case:
    """One ``int8_linear`` call as comfy-kitchen hands it to the shim."""

    name: str
    x_shape: tuple
    n: int
    x_dtype: str = "bfloat16"
    out_dtype: str = "bfloat16"
    bias: object = None  # dtype name of the bias given to int8_linear, or None
    scale: str = "[N,1]"  # stored weight-scale shape: "()", "[N]" or "[N,1]"
    scale_dtype: str = "float32"
    layout: str = "contiguous"  # "strided": a column slice; "offset": a batch slice
    zero_row: bool = False
    convrot: int = 0  # ConvRot group size, 0 = off
    path: str = "npu"  # "npu": the INT8 ops; "fallback": the dequantized linear


def matrix():
    """The INT8 calls to check: each axis of what the shim passes, on small shapes."""
    layers = tuple(Case("int8_linear M=%d K=%d N=%d" % (m, k, n), (m, k), n) for m, k, n in LAYER_SHAPES)
    return layers + (
        Case("M=1, bf16 out, no bias, scale [N,1]", (1, 64), 48),
        Case("odd M, bf16 out, bf16 bias, scale ()", (37, 80), 56, bias="bfloat16", scale="()"),
        Case("odd M, fp16 out, fp16 bias, scale [N]", (37, 80), 56, "float16", "float16", "float16", "[N]"),
        Case("fp16 out, no bias, scale [N,1]", (16, 64), 32, "float16", "float16"),
        Case("fp16 x, bf16 out, fp32 bias (passed as bf16)", (9, 64), 40, "float16", "bfloat16", "float32"),
        Case("bf16 x, fp16 out, bf16 bias (passed as fp16)", (9, 64), 40, "bfloat16", "float16", "bfloat16",
             "[N]"),
        Case("bf16 weight scale [N,1], bf16 bias", (8, 64), 32, bias="bfloat16", scale_dtype="bfloat16"),
        Case("M=1030 past the 128- to 1024-row tiles, bf16 bias", (1030, 64), 48, bias="bfloat16"),
        Case("K=104 N=40 (off the 16-grid), bf16 bias", (12, 104), 40, bias="bfloat16"),
        Case("K=97 N=45 (odd), fp16 bias", (11, 97), 45, "float16", "float16", "float16"),
        Case("3-D x [2,19,K], bf16 bias", (2, 19, 64), 48, bias="bfloat16"),
        Case("3-D x batch slice (storage offset), fp16 bias", (2, 7, 64), 40, "float16", "float16", "float16",
             layout="offset"),
        Case("2-D x column slice (row stride > K), bf16 bias", (21, 64), 48, bias="bfloat16", layout="strided"),
        Case("all-zero activation row, bf16 bias", (7, 64), 32, bias="bfloat16", zero_row=True),
        Case("ConvRot group 16, bf16 bias", (9, 64), 48, bias="bfloat16", convrot=16),
        Case("ConvRot group 256, fp16 bias", (5, 512), 40, "float16", "float16", "float16", convrot=256),
        Case("fallback: dequantized linear, bf16 bias", (13, 64), 48, bias="bfloat16", path="fallback"),
        Case("fallback: dequantized linear, fp16, fp16 bias, scale ()", (13, 64), 48, "float16", "float16",
             "float16", "()", path="fallback"),
    )


# --------------------------------------------------------------------------- recording the device calls


@dataclasses.dataclass
class Call:
    op: str
    args: tuple
    kwargs: dict
    result: object = None
    error: object = None  # what the call raised


class RecordingOps:
    """``torch_npu`` as the shim sees it, remembering each op call's arguments and results."""

    def __init__(self, ops):
        self._ops = ops
        self.calls = []

    def __getattr__(self, name):
        target = getattr(self._ops, name)
        if not (name.startswith("npu_") and callable(target)):
            return target

        def recorded(*args, **kwargs):
            call = Call(name, args, kwargs)
            self.calls.append(call)
            try:
                call.result = target(*args, **kwargs)
            except Exception as exc:  # kept for the report; a caller may catch it and fall back
                call.error = "%s: %s" % (type(exc).__name__, exc)
                raise
            return call.result

        return recorded


def describe(value):
    """A JSON-able description of one argument."""
    import torch

    if isinstance(value, torch.Tensor):
        return {"shape": list(value.shape), "dtype": str(value.dtype), "stride": list(value.stride()),
                "storage_offset": value.storage_offset(), "device": str(value.device),
                "contiguous": value.is_contiguous()}
    if isinstance(value, torch.dtype):
        return str(value)
    return repr(value)


def describe_call(call):
    names = POSITIONAL.get(call.op, ())
    args = {names[i] if i < len(names) else "arg%d" % i: describe(a) for i, a in enumerate(call.args)}
    args.update((key, describe(value)) for key, value in call.kwargs.items())
    return {"call": "torch_npu." + call.op, "arguments": args}


def call_text(described):
    """``torch_npu.npu_quant_matmul(x1=Tensor[37, 80] torch.int8 stride=(80, 1) ..., output_dtype=...)``."""
    parts = []
    for key, value in described["arguments"].items():
        if isinstance(value, dict):
            value = "Tensor%s %s stride=%s offset=%d %s" % (
                value["shape"], value["dtype"], tuple(value["stride"]), value["storage_offset"], value["device"])
        parts.append("%s=%s" % (key, value))
    return "%s(%s)" % (described["call"], ", ".join(parts))


# --------------------------------------------------------------------------- inputs and references


def f64(t):
    import torch

    return t.detach().to(device="cpu", dtype=torch.float64)


def hadamard(size):
    """Normalized regular Hadamard matrix of order ``size`` (a power of four), float64."""
    import torch

    h4 = torch.ones(4, 4, dtype=torch.float64) - 2 * torch.eye(4, dtype=torch.float64).flip(0)
    h = h4
    while h.shape[0] < size:
        h = torch.kron(h, h4)
    return h / size ** 0.5


def rotate(x, group):
    """``x`` rotated by the block Hadamard of ConvRot, per group of ``group`` columns."""
    shape = x.shape
    return (x.reshape(-1, shape[-1] // group, group) @ hadamard(group)).reshape(shape)


def quantize_weight(w, per_row, torch):
    """Symmetric int8 weight and its scale, per output row or per tensor."""
    amax = w.abs().amax(dim=1, keepdim=True) if per_row else w.abs().amax()
    scale = (amax / 127.0).clamp(min=1e-8)
    return torch.round(w / scale).clamp(-127, 127).to(torch.int8), scale


def make_inputs(case, device, seed):
    """x, weight, weight_scale, bias of ``case``, on ``device``, as ComfyUI stores them."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    k, n = case.x_shape[-1], case.n
    x_dtype = getattr(torch, case.x_dtype)
    if case.layout == "strided":
        wide = torch.randn(case.x_shape[0], k + 16, generator=generator).to(device, x_dtype)
        x = wide[:, 8:8 + k]
    elif case.layout == "offset":
        batch = torch.randn((case.x_shape[0] + 1,) + tuple(case.x_shape[1:]), generator=generator)
        x = batch.to(device, x_dtype)[1:]
    else:
        x = torch.randn(case.x_shape, generator=generator)
        if case.zero_row:
            x.reshape(-1, k)[min(3, x.numel() // k - 1)] = 0
        x = x.to(device, x_dtype)
    w = torch.randn(n, k, generator=generator) / k ** 0.5
    q, scale = quantize_weight(w, case.scale != "()", torch)
    scale = scale.reshape({"()": (), "[N]": (n,), "[N,1]": (n, 1)}[case.scale])
    bias = None
    if case.bias:
        magnitude = torch.rand(n, generator=generator) + 0.5  # |bias| in [0.5, 1.5): outputs are ~1
        sign = torch.randint(0, 2, (n,), generator=generator) * 2 - 1
        bias = (magnitude * sign).to(device, getattr(torch, case.bias))
    return x, q.to(device), scale.to(device, getattr(torch, case.scale_dtype)), bias


def float_reference(x, weight, weight_scale, bias, convrot):
    """The layer in float64 on the CPU: (rotated) x @ dequantized weight.T + bias."""
    xf = f64(x)
    if convrot:
        xf = rotate(xf, convrot)
    scale = f64(weight_scale).reshape(-1)
    w = f64(weight) * (scale.reshape(-1, 1) if scale.numel() > 1 else scale)
    out = xf @ w.t()
    return out if bias is None else out + f64(bias)


# --------------------------------------------------------------------------- checks


def compare(out, reference):
    """Cosine and relative MAE of ``out`` against ``reference``."""
    import torch

    o = f64(out).reshape(-1)
    r = f64(reference).reshape(-1)
    if not torch.isfinite(o).all():
        return {"cosine": float("nan"), "rel_mae": float("inf")}
    return {"cosine": torch.nn.functional.cosine_similarity(o, r, dim=0).item(),
            "rel_mae": ((o - r).abs().mean() / r.abs().mean()).item()}


def end_to_end_failures(metrics):
    failures = []
    if not metrics["cosine"] >= COSINE_MIN:
        failures.append("cosine %.6f < %s against the float64 layer" % (metrics["cosine"], COSINE_MIN))
    if not metrics["rel_mae"] <= REL_MAE_MAX:
        failures.append("relative MAE %.4f > %s against the float64 layer" % (metrics["rel_mae"], REL_MAE_MAX))
    return failures


def dynamic_quant_check(call):
    """``npu_dynamic_quant`` against round-half-even of x * 127 / max|x| per row, in float64."""
    import torch

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


def quant_matmul_check(call):
    """``npu_quant_matmul`` against acc * scale * pertoken + bias in float64 from its own inputs."""
    import torch

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


def device_call_checks(calls):
    """Every recorded quant call checked on its own inputs."""
    checkers = {"npu_dynamic_quant": dynamic_quant_check, "npu_quant_matmul": quant_matmul_check}
    metrics, failures = {}, []
    raised = [c for c in calls if c.error is not None]
    if raised:
        return metrics, ["torch_npu.%s raised %s" % (c.op, c.error) for c in raised]
    for call in calls:
        checker = checkers.get(call.op)
        if checker is not None:
            found, failed = checker(call)
            metrics.update(found)
            failures.extend(failed)
    missing = [op for op in checkers if op not in {c.op for c in calls}]
    if missing:
        failures.append("the INT8 path made no %s call" % " and no ".join(missing))
    return metrics, failures


def fallback_check(out, x, weight, weight_scale, bias):
    """The dequantized linear: within GEMM rounding in x's dtype of the float64 layer."""
    import torch

    reference = float_reference(x, weight, weight_scale, bias, 0)
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


class Matrix:
    """Runs ``Case``s through the shim's INT8 math (``int8_math``) on one device.

    The device calls are exactly the production ones: the activation
    flattened to 2-D, ConvRot by comfy-kitchen's own rotation, then
    ``npu_quant_linear`` (dynamic quant + quant matmul) or the dequantized
    fallback linear.
    """

    def __init__(self, torch_npu, device):
        self.device = device
        self.ops = RecordingOps(torch_npu)

    @staticmethod
    def kwargs(case, x, weight, weight_scale, bias):
        import torch

        return dict(x=x, weight=weight, weight_scale=weight_scale, bias=bias,
                    out_dtype=getattr(torch, case.out_dtype), convrot=bool(case.convrot),
                    convrot_groupsize=case.convrot or 256)

    @staticmethod
    def skip_reason(case, kwargs):
        from ascend_shim.kitchen import contract

        if case.convrot and kitchen_rotation() is None:
            return KITCHEN_ABSENT  # ConvRot's Hadamard rotation is kitchen's
        if case.path == "npu":
            declined = contract.check(contract.int8_linear_call(**kwargs), frozenset({None}))
            if declined:
                return "the shim declines this call (%s: %s)" % declined
        return None

    def compute(self, case, kwargs):
        from ascend_shim.npu_math import int8 as int8_math

        x, weight = kwargs["x"], kwargs["weight"]
        if case.path == "fallback":
            return int8_math.dequantized_linear(x, weight, kwargs["weight_scale"], kwargs["bias"],
                                                kwargs["out_dtype"])
        if case.convrot:
            build_hadamard, rotate_activation = kitchen_rotation()
            x = rotate_activation(x, build_hadamard(case.convrot, device=x.device, dtype=x.dtype), case.convrot)
        shape = x.shape
        x2d = x if len(shape) == 2 else x.reshape(-1, shape[-1])
        out = int8_math.npu_quant_linear(x2d, weight, kwargs["weight_scale"], kwargs["bias"],
                                         kwargs["out_dtype"], self.ops)
        return out if len(shape) == 2 else out.reshape(*shape[:-1], weight.shape[0])

    def run(self, case, seed):
        x, weight, weight_scale, bias = make_inputs(case, self.device, seed)
        kwargs = self.kwargs(case, x, weight, weight_scale, bias)
        result = {"name": case.name, "path": case.path}
        skipped = self.skip_reason(case, kwargs)
        if skipped:
            result.update(passed=True, skipped=skipped)
            return result
        self.ops.calls = []
        try:
            out = self.compute(case, kwargs)
        except Exception as exc:
            result.update(passed=False, failures=["the call raised %s: %s" % (type(exc).__name__, exc)],
                          calls=[describe_call(c) for c in self.ops.calls] or [fallback_call(kwargs)])
            return result
        metrics, failures = case_checks(case, out, kwargs, self.ops.calls)
        result.update(metrics)
        result.update(passed=not failures, failures=failures,
                      calls=[describe_call(c) for c in self.ops.calls] or [fallback_call(kwargs)])
        return result


def case_checks(case, out, kwargs, calls):
    """(metrics, failures) of one matrix case: its output, its device calls, the layer."""
    failures = output_failures(out, kwargs)
    if failures:
        return {}, failures
    x, weight, weight_scale, bias = (kwargs[k] for k in ("x", "weight", "weight_scale", "bias"))
    if case.path == "fallback":
        return fallback_check(out, x, weight, weight_scale, bias)
    metrics, failures = device_call_checks(calls)
    e2e = compare(out, float_reference(x, weight, weight_scale, bias, case.convrot))
    metrics.update(e2e)
    return metrics, failures + end_to_end_failures(e2e)


def output_failures(out, kwargs):
    x, weight = kwargs["x"], kwargs["weight"]
    expected = (list(x.shape[:-1]) + [weight.shape[0]], kwargs["out_dtype"], x.device)
    got = (list(out.shape), out.dtype, out.device)
    if got != expected:
        return ["output %s %s on %s, expected %s %s on %s" % (got + expected)]
    return []


def kitchen_rotation():
    """comfy-kitchen's ConvRot (build_hadamard, rotate_activation), as the backend uses them, or None."""
    from ascend_shim.kitchen import registry_access

    return registry_access.convrot().value


def fallback_call(kwargs):
    """The on-device fallback described like a device call (it is a float linear)."""
    names = ("x", "weight", "weight_scale", "bias", "out_dtype")
    return {"call": "ascend_shim.npu_math.int8.dequantized_linear",
            "arguments": {name: describe(kwargs[name]) for name in names}}


# --------------------------------------------------------------------------- the other checks


def quantized_weight(n, k, device):
    import torch

    q, scale = quantize_weight(torch.randn(n, k), True, torch)
    return q.to(device), scale.to(device)


def report_check(torch, torch_npu, device):
    """The call from the original report: bf16 activations, int8 weight, shape/dtype/device."""
    x = torch.randn(128, 2048, dtype=torch.bfloat16, device=device)
    w = torch.randint(-127, 128, (2048, 2048), dtype=torch.int8, device=device)
    scale = torch.full((2048,), 0.01, dtype=torch.float32, device=device)
    x8, x_scale = torch_npu.npu_dynamic_quant(x)
    y = torch_npu.npu_quant_matmul(x8, w.t(), scale, pertoken_scale=x_scale.reshape(-1).float(),
                                   output_dtype=torch.bfloat16)
    ok = tuple(y.shape) == (128, 2048) and y.dtype == torch.bfloat16 and y.device.type == "npu"
    return {"name": "dynamic quant + quant matmul", "shape": list(y.shape), "dtype": str(y.dtype),
            "device": str(y.device), "passed": ok}


def kitchen_check(torch, device):
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
    result = {"name": "comfy-kitchen int8_linear", "backend": backend}
    result.update(compare(out, float_reference(x, q, scale, None, 0)))
    result["passed"] = (backend != "eager" and result["cosine"] >= COSINE_MIN
                        and result["rel_mae"] <= REL_MAE_MAX)
    return result


# (name, dtype of a, M, K, N, operands): K past 1024 crosses the exact fp32 chunks;
# "extreme" makes every product -128 * -128, so each full chunk sums to exactly 2**24
INT_MM_CASES = (
    ("int8 M=17 K=2500 N=33", "int8", 17, 2500, 33, "random"),
    ("int8 M=8 K=2048 N=16, every product 2**14", "int8", 8, 2048, 16, "extreme"),
    ("uint8 x int8 M=9 K=600 N=24, mat2 a .t() view", "uint8", 9, 600, 24, "transposed"),
)


def int_mm_operands(spec, seed):
    """CPU operands of one ``INT_MM_CASES`` entry."""
    import torch

    _, a_dtype, m, k, n, kind = spec
    generator = torch.Generator().manual_seed(seed)
    if kind == "extreme":
        return torch.full((m, k), -128, dtype=torch.int8), torch.full((k, n), -128, dtype=torch.int8)
    low = 0 if a_dtype == "uint8" else -128
    a = torch.randint(low, low + 256, (m, k), generator=generator, dtype=getattr(torch, a_dtype))
    if kind == "transposed":
        b = torch.randint(-128, 128, (n, k), generator=generator, dtype=torch.int8).t()
    else:
        b = torch.randint(-128, 128, (k, n), generator=generator, dtype=torch.int8)
    return a, b


def int_mm_checks(torch, device):
    """``aten::_int_mm`` on the device, bit-exact against CPU ``torch._int_mm``.

    With ``torch.npu.matmul.allow_hf32`` off and, as a user may leave it, on:
    an fp32 GEMM in HF32 is not exact (FACTS 7.3), and the user's setting
    must survive the call.
    """
    try:
        from ascend_shim.aten import int_mm
    except ImportError:  # a shim without the kernel
        return []
    if not int_mm.registered() and int_mm.served_elsewhere() is None:
        int_mm.register()  # what the int_mm patch does when torch_npu loads
    served_by = "ascend_shim" if int_mm.registered() else "torch_npu"
    settings = getattr(torch.npu, "matmul", None)
    flags = (False, True) if hasattr(settings, "allow_hf32") else (None,)
    user = settings.allow_hf32 if flags[0] is not None else None
    results = []
    try:
        for seed, spec in enumerate(INT_MM_CASES):
            a, b = int_mm_operands(spec, seed)
            expected = torch._int_mm(a, b)
            for hf32 in flags:
                results.append(int_mm_case(torch, spec[0], a, b, expected, device, settings, hf32, served_by))
    finally:
        if user is not None:
            settings.allow_hf32 = user
    return results


def int_mm_case(torch, name, a, b, expected, device, settings, hf32, served_by):
    label = {None: "", False: ", HF32 off", True: ", HF32 on"}[hf32]
    result = {"name": "aten::_int_mm %s%s" % (name, label), "served_by": served_by}
    a_dev, b_dev = a.to(device), b.to(device)
    call = {"call": "torch._int_mm", "arguments": {"self": describe(a_dev), "mat2": describe(b_dev)}}
    if hf32 is not None:
        settings.allow_hf32 = hf32
        call["arguments"]["torch.npu.matmul.allow_hf32"] = hf32
    failures = []
    try:
        out = torch._int_mm(a_dev, b_dev)
    except Exception as exc:
        out = None
        failures.append("the call raised %s: %s" % (type(exc).__name__, exc))
    if out is not None:
        got = out.detach().to("cpu")
        if got.dtype != torch.int32 or got.shape != expected.shape or out.device != device:
            failures.append("output %s %s on %s, expected torch.int32 %s on %s"
                            % (got.dtype, list(got.shape), out.device, list(expected.shape), device))
        else:
            wrong = got != expected
            result["mismatches"] = int(wrong.sum().item())
            if result["mismatches"]:
                result["max_abs_diff"] = int((got.long() - expected.long()).abs().max().item())
                failures.append("%d of %d elements differ from CPU torch._int_mm (max |diff| %d)"
                                % (result["mismatches"], wrong.numel(), result["max_abs_diff"]))
    if hf32 is not None and settings.allow_hf32 != hf32:
        failures.append("torch.npu.matmul.allow_hf32 was %s before the call and %s after"
                        % (hf32, settings.allow_hf32))
    result.update(passed=not failures, failures=failures, calls=[call])
    return result


# W4A8 (kitchen 0.2.27+): packed int4 codes decoded to int8 on the device, then the INT8 ops
# (name, x shape, N, codebook, ConvRot group, x/out dtype, bias dtype)
W4A8_CASES = (
    ("W4A8 uniform levels, ConvRot 16, bf16 bias", (9, 64), 48, False, 16, "bfloat16", "bfloat16"),
    ("W4A8 codebook, ConvRot 256, 3-D x, fp16 bias", (2, 5, 256), 40, True, 256, "float16", "float16"),
)
W4A8_GROUP = 16
# a symmetric non-uniform 16-level table on the int4 scale, like kitchen's Lloyd-Max codebooks
W4A8_CODEBOOK = (-7.9, -5.8, -4.4, -3.3, -2.4, -1.6, -0.9, -0.3, 0.3, 0.9, 1.6, 2.4, 3.3, 4.4, 5.8, 7.9)


def w4a8_inputs(spec, device, seed):
    """codes [N, K] (CPU), and x, qdata, s_rel, s_channel, codebook, bias on the device."""
    import torch

    from ascend_shim.npu_math import fp8 as fp8_math

    _, x_shape, n, with_codebook, _, dtype, bias_dtype = spec
    generator = torch.Generator().manual_seed(seed)
    k = x_shape[-1]
    codes = torch.randint(0, 16, (n, k), generator=generator, dtype=torch.int32)
    packed = (codes[:, 0::2] | (codes[:, 1::2] << 4)).to(torch.uint8).view(torch.int8)  # even column low
    # group scales as checkpoints store them: float8_e4m3fn, decoded on the host like the loader does
    s_rel_fp8 = (torch.rand(n, k // W4A8_GROUP, generator=generator) * 11 + 4).to(torch.float8_e4m3fn)
    s_rel = fp8_math.decode_group_scales(s_rel_fp8.view(torch.uint8))
    s_channel = torch.rand(n, generator=generator) * 0.004 + 0.001
    codebook = torch.tensor(W4A8_CODEBOOK) if with_codebook else None
    x = torch.randn(x_shape, generator=generator).to(device, getattr(torch, dtype))
    magnitude = torch.rand(n, generator=generator) + 0.5
    sign = torch.randint(0, 2, (n,), generator=generator) * 2 - 1
    bias = (magnitude * sign).to(device, getattr(torch, bias_dtype))
    return codes, dict(x=x, qdata=packed.to(device), s_rel=s_rel.to(device), s_channel=s_channel.to(device),
                       codebook=None if codebook is None else codebook.to(device), bias=bias)


def w4a8_reference_weight(codes, s_rel, codebook):
    """The int8 weight of the codes: level * s_rel in fp32, round half to even, clamp to +-127."""
    import torch

    levels = codes.to(torch.float32) - 8 if codebook is None else f64(codebook).float()[codes.long()]
    n, k = codes.shape
    scaled = levels.reshape(n, -1, W4A8_GROUP) * f64(s_rel).float().unsqueeze(-1)
    return torch.round(scaled.reshape(n, k)).clamp(-127, 127).to(torch.int8)


def w4a8_checks(torch, device):
    """The shim's W4A8 linear: the device decode bit-exact, its quant calls, and the layer vs float64."""
    try:
        import comfy_kitchen as ck

        from ascend_shim.kitchen import w4a8
    except ImportError:
        return []
    rotation = kitchen_rotation()
    if not hasattr(ck, w4a8.LINEAR) or rotation is None:
        return []
    import torch_npu

    build_hadamard, rotate_activation = rotation
    ops = RecordingOps(torch_npu)
    linear = w4a8.W4A8Linear(
        ops, lambda x, act, weight, eps: x,
        lambda x, group: rotate_activation(x, build_hadamard(group, device=x.device, dtype=x.dtype), group),
        frozenset({None}))
    results = []
    for seed, spec in enumerate(W4A8_CASES):
        codes, kw = w4a8_inputs(spec, device, seed)
        ops.calls = []
        result = {"name": spec[0], "path": "w4a8"}
        try:
            out = linear.linear(group_size=W4A8_GROUP, convrot_groupsize=spec[4],
                                out_dtype=getattr(torch, spec[5]), **kw)
        except Exception as exc:
            out, failures = None, ["the call raised %s: %s" % (type(exc).__name__, exc)]
        if out is not None:
            failures = w4a8_failures(out, codes, kw, spec, ops.calls, result, torch)
        result.update(passed=not failures, failures=failures, calls=[describe_call(c) for c in ops.calls])
        results.append(result)
    return results


def w4a8_failures(out, codes, kw, spec, calls, result, torch):
    weight = w4a8_reference_weight(codes, kw["s_rel"], kw["codebook"])
    expected = dict(x=kw["x"], weight=weight, out_dtype=getattr(torch, spec[5]))
    failures = output_failures(out, expected)
    if failures:
        return failures
    metrics, failures = device_call_checks(calls)
    result.update(metrics)
    matmuls = [c for c in calls if c.op == "npu_quant_matmul" and c.result is not None]
    if matmuls:
        decoded = matmuls[-1].args[1].t().detach().to("cpu")
        result["decode_mismatches"] = int((decoded != weight).sum().item())
        if result["decode_mismatches"]:
            failures.append("%d of %d decoded int8 weights differ from the codes' levels * s_rel"
                            % (result["decode_mismatches"], weight.numel()))
    e2e = compare(out, float_reference(kw["x"], weight, kw["s_channel"], kw["bias"], spec[4]))
    result.update(e2e)
    return failures + end_to_end_failures(e2e)


# FP8 checkpoints are decoded on the host before anything reaches the NPU
def fp8_value(bits, exponent_bits, mantissa_bits, finite_only):
    """float64 value of 8-bit float codes (uint8 tensor), from the bit fields alone."""
    import torch

    bias = (1 << (exponent_bits - 1)) - 1
    b = bits.to(torch.int64)
    sign = torch.where((b >> 7) & 1 == 1, -1.0, 1.0).to(torch.float64)
    exponent = (b >> mantissa_bits) & ((1 << exponent_bits) - 1)
    mantissa = (b & ((1 << mantissa_bits) - 1)).to(torch.float64)
    normal = (1 + mantissa / (1 << mantissa_bits)) * torch.pow(2.0, (exponent - bias).to(torch.float64))
    subnormal = mantissa / (1 << mantissa_bits) * 2.0 ** (1 - bias)
    value = sign * torch.where(exponent == 0, subnormal, normal)
    top = exponent == (1 << exponent_bits) - 1
    if finite_only:  # e4m3fn: only S.1111.111 is NaN
        return torch.where(top & (mantissa == (1 << mantissa_bits) - 1), float("nan"), value)
    value = torch.where(top & (mantissa == 0), sign * float("inf"), value)
    return torch.where(top & (mantissa != 0), float("nan"), value)


FP8_FORMATS = (("float8_e4m3fn", 4, 3, True), ("float8_e5m2", 5, 2, False))


def fp8_checks(torch, device):
    """Every float8 code decoded by the shim: exact in bf16, scaled within one rounding."""
    try:
        from ascend_shim.npu_math import fp8 as fp8_math
    except ImportError:
        return []
    results = []
    for name, exponent_bits, mantissa_bits, finite_only in FP8_FORMATS:
        dtype = getattr(torch, name, None)
        if dtype is None:
            continue
        bits = torch.arange(256, dtype=torch.int32).to(torch.uint8).reshape(16, 16)
        expected = fp8_value(bits, exponent_bits, mantissa_bits, finite_only)
        result = {"name": "fp8 decode %s, all 256 codes" % name, "path": "fp8 (host)"}
        failures = []
        try:
            plain = fp8_math.decode(bits.view(dtype)).to(device)
            scale = torch.rand(16, 1, generator=torch.Generator().manual_seed(7)) + 0.5
            scaled = fp8_math.decode(bits.view(dtype), scale).to(device)
        except Exception as exc:
            plain = scaled = None
            failures.append("the decode raised %s: %s" % (type(exc).__name__, exc))
        if plain is not None:
            failures += fp8_failures(plain, scaled, expected, scale, result)
        result.update(passed=not failures, failures=failures,
                      calls=[{"call": "ascend_shim.npu_math.fp8.decode",
                              "arguments": {"weight": "all 256 %s codes as [16, 16]" % name,
                                            "scale": "None, then float32 [16, 1]"}}])
        results.append(result)
    return results


def fp8_failures(plain, scaled, expected, scale, result):
    import torch

    failures = []
    got = f64(plain)
    finite = torch.isfinite(expected)
    same = torch.where(finite, got == expected, torch.isnan(expected) & torch.isnan(got) | (got == expected))
    result["mismatches"] = int((~same).sum().item())
    if plain.dtype != torch.bfloat16 or result["mismatches"]:
        bad = int((~same).reshape(-1).nonzero()[0].item()) if result["mismatches"] else 0
        failures.append("decode without scale: %s, %d of 256 codes differ (code 0x%02x gave %r, its value is %r)"
                        % (plain.dtype, result["mismatches"], bad, got.reshape(-1)[bad].item(),
                           expected.reshape(-1)[bad].item()))
    reference = expected * f64(scale)
    allowed = torch.finfo(torch.bfloat16).eps * reference.abs()
    ratio = ((f64(scaled) - reference).abs() / allowed.clamp(min=torch.finfo(torch.float32).tiny))[finite]
    result["scaled_max_err_ratio"] = ratio.max().item()
    if not result["scaled_max_err_ratio"] <= 1.0:
        failures.append("decode with a per-row scale off by %.3g times one bf16 rounding"
                        % result["scaled_max_err_ratio"])
    return failures


# each returns the results of one more device path; empty when this shim lacks it
EXTRA_CHECKS = (int_mm_checks, w4a8_checks, fp8_checks)


def _fallbacks(caught):
    from ascend_shim.engine.fallback_report import PATTERN

    return sorted({m.group(1) for w in caught for m in [PATTERN.search(str(w.message))] if m})


def versions(torch, torch_npu, device):
    """What a bug report needs: torch, torch_npu, CANN, device, Python, shim, comfy-kitchen."""
    import ascend_shim

    try:
        from torch_npu.utils.collect_env import get_cann_version

        cann = get_cann_version()
    except Exception as exc:
        cann = "unknown (%s: %s)" % (type(exc).__name__, exc)
    return {"device": torch.npu.get_device_name(device.index), "torch": torch.__version__,
            "torch_npu": torch_npu.__version__, "cann": cann, "python": platform.python_version(),
            "ascend_shim": ascend_shim.__version__,
            "comfy_kitchen": distribution("comfy-kitchen")}


def guarded(name, checks):
    """``checks()``, or one failed check named ``name`` with what it raised."""
    try:
        return checks()
    except Exception as exc:
        return [{"name": name, "passed": False, "failures": ["raised %s: %s" % (type(exc).__name__, exc)]}]


def run():
    from ascend_shim.engine import fallback_report
    from ascend_shim.engine.npu import npu_reason

    reason = npu_reason()
    if reason:
        return {"npu": False, "reason": reason, "checks": [], "passed": False}
    import torch
    import torch_npu

    torch.manual_seed(0)
    device = torch.device("npu", torch.npu.current_device())
    checks = []
    # torch_npu's fallback warning is a C++ line on stderr, not a Python warning
    with warnings.catch_warnings(record=True) as caught, fallback_report.native_fallbacks() as native:
        warnings.simplefilter("always")
        checks += guarded("dynamic quant + quant matmul", lambda: [report_check(torch, torch_npu, device)])
        cases = Matrix(torch_npu, device)
        for seed, case in enumerate(matrix()):
            checks.append(cases.run(case, seed))
        for extra in EXTRA_CHECKS:
            checks += guarded(extra.__name__, lambda: extra(torch, device))
        checks += guarded("comfy-kitchen int8_linear",
                          lambda: [c for c in [kitchen_check(torch, device)] if c is not None])
        torch.npu.synchronize()
    fallbacks = sorted(set(_fallbacks(caught)) | set(native))
    checks.append({"name": "no CPU fallback", "fallbacks": fallbacks, "passed": not fallbacks})
    info = versions(torch, torch_npu, device)
    return {"npu": True, "device": info["device"], "torch_npu": info["torch_npu"], "versions": info,
            "checks": checks, "passed": all(c["passed"] for c in checks),
            "not_checked": not_checked(checks)}


def not_checked(checks):
    """{reason: [names of the checks skipped for it]}: what a pass does not cover."""
    skipped = {}
    for check in checks:
        if check.get("skipped"):
            skipped.setdefault(check["skipped"], []).append(check["name"])
    return skipped


# --------------------------------------------------------------------------- output


def check_lines(check):
    status = "SKIP" if check.get("skipped") else ("PASS" if check["passed"] else "FAIL")
    detail = ", ".join("%s=%s" % (k, ("%.6g" % v) if isinstance(v, float) else v)
                       for k, v in check.items()
                       if k not in ("name", "passed", "failures", "calls", "path"))
    lines = [fill("  [%s] %s  %s" % (status, check["name"], detail), 9)]
    if not check["passed"]:
        lines += [fill(failure, 8, first=" " * 6) for failure in check.get("failures", ())]
        lines += ["      %s" % call_text(call) for call in check.get("calls", ())]
    return lines


def text_report(result):
    info = result["versions"]
    lines = [fill(
        "selftest on %s: torch %s, torch_npu %s, CANN %s, Python %s, ascend_shim %s, comfy-kitchen %s"
        % (info["device"], info["torch"], info["torch_npu"], info["cann"], info["python"],
           info["ascend_shim"], info["comfy_kitchen"] or "not installed"), 2)]
    for check in result["checks"]:
        lines += check_lines(check)
    failed = [c["name"] for c in result["checks"] if not c["passed"]]
    lines.append(fill(
        "thresholds: end to end cosine >= %s, relative MAE <= %.0f%%; device calls against float64 "
        "on their own inputs (ratio <= 1 passes)" % (COSINE_MIN, REL_MAE_MAX * 100)))
    for reason, names in result.get("not_checked", {}).items():
        lines.append(fill("NOT checked: %s (%s)%s" % (
            "; ".join(names), reason,
            ": comfy-kitchen's dispatch of int8_linear to the shim and its ConvRot rotation were not "
            "tested; install it in this venv and run selftest again" if reason == KITCHEN_ABSENT else ""), 2))
    if failed:
        lines.append(fill(
            "%d check(s) failed: %s. To report it, paste this whole output (or `python -m "
            "ascend_shim selftest --json`) into a bug report." % (len(failed), "; ".join(failed))))
    return "\n".join(lines)


def main(options):
    result = run()
    if options.json:
        _json_report.emit(result)
    elif not result["npu"]:
        print("selftest needs an Ascend NPU: %s" % result["reason"])
    else:
        print(text_report(result))
    if not result["npu"]:
        return NO_NPU
    return PASSED if result["passed"] else FAILED
