"""INT8 linear cases on the simulated NPU, for one real comfy-kitchen release.

Run in a fresh interpreter on the test bed (``ASCEND_TESTBED=ascend-cu130``,
the kitchen release on PYTHONPATH, the shim installed in the venv). Prints
one JSON object: a list of case records and the shim's INT8 report. The
assertions live in ``test_backend.py``; this script only measures.

    python int8_cases.py [grid|bad|policy|disabled|mm_int8|input_errors|old_signature|opaque_signature]
"""

import contextlib
import dataclasses
import functools
import inspect
import json
import logging
import sys

import torch
import torch.nn.functional as F
import torch_npu  # noqa: F401  (registers the npu device, as on a real box)

SUITE = sys.argv[1] if len(sys.argv) > 1 else "grid"
REAL_QUANT_MATMUL = torch_npu.npu_quant_matmul


def quant_matmul_before_pertoken(x1, x2, scale, *, offset=None, bias=None, output_dtype=None):
    """npu_quant_matmul as op-plugin released it before per-token scaling (2024-03)."""
    return REAL_QUANT_MATMUL(x1, x2, scale, offset=offset, bias=bias, output_dtype=output_dtype)


def quant_matmul_opaque(*args, **kwargs):
    """The same op behind a C++ binding: no readable signature, a TypeError at call time."""
    if "pertoken_scale" in kwargs:
        raise TypeError("npu_quant_matmul(): got an unexpected keyword argument 'pertoken_scale'")
    return quant_matmul_before_pertoken(*args, **kwargs)


# stacks whose npu_quant_matmul cannot take what the INT8 path passes, set up
# before comfy-kitchen (and with it the shim's backend) loads
OLD_OPS = {"old_signature": quant_matmul_before_pertoken, "opaque_signature": quant_matmul_opaque}
if SUITE in OLD_OPS:
    torch_npu.npu_quant_matmul = OLD_OPS[SUITE]

import comfy_kitchen as ck  # noqa: E402
from comfy_kitchen.registry import registry  # noqa: E402
from testbed import npu_device  # noqa: E402

NPU = torch.device("npu", 0)
PARAMS = set(inspect.signature(ck.int8_linear).parameters)
torch.manual_seed(0)


def device_log():
    return torch_npu._testbed


def int_mm_cube_calls(log):
    """``npu_quant_matmul`` calls with int32 output: the shim's ``_int_mm`` kernel (and its probe)."""
    return sum(1 for r in log.records if r.op == "npu_quant_matmul" and r.options.get("output_dtype") == torch.int32)


def quantize_weight(w, per_channel):
    """Symmetric int8 weight and its fp32 scale, stored like ComfyUI: () or [N, 1]."""
    if per_channel:
        scale = (w.abs().amax(dim=1, keepdim=True) / 127.0).clamp(min=1e-8)
    else:
        scale = (w.abs().max() / 127.0).clamp(min=1e-8).reshape(())
    q = torch.round(w / scale).clamp(-127, 127).to(torch.int8)
    return q, scale.float()


def input_act_cpu(x, act, act_weight=None, eps=1e-6):
    if act in (None, "none"):
        return x
    from comfy_kitchen.backends._activations import apply_input_act

    if len(inspect.signature(apply_input_act).parameters) >= 4:
        return apply_input_act(x, act, act_weight, eps)
    return apply_input_act(x, act)


def swiglu_fused_calls():
    """How often the shim's INT8 path ran ``input_act="swiglu"`` as one npu_swiglu so far."""
    from ascend_shim.kitchen import registration

    return ((registration.report().get("swiglu") or {}).get("calls") or {}).get("fused", 0)


def reference(x, q, scale, bias=None, act=None, act_weight=None, eps=1e-6, group=None,
              residual=None, residual_scale=None, int8=False, fused=False):
    """float32 on the CPU: act, rotation, dequantized weight, bias, residual.

    With ``int8=True`` the activations are first quantized per token exactly
    as documented for npu_dynamic_quant (fp32 127/rowmax, round half even),
    so the INT8 arithmetic itself can be checked tightly.
    """
    if int8 and act == "swiglu" and fused:
        # the shim's path: one npu_swiglu, float32 inside, rounded once to x's dtype (kitchen/swiglu.py)
        gate, up = x.cpu().float().chunk(2, dim=-1)
        xf = (F.silu(gate) * up).to(x.dtype).float()
    elif int8:  # the device applies the activation in x's dtype, then quantizes
        xf = input_act_cpu(x.cpu(), act, None if act_weight is None else act_weight.cpu(), eps).float()
    else:
        xf = input_act_cpu(x.cpu().float(), act, None if act_weight is None else act_weight.cpu().float(), eps)
    if group:
        from comfy_kitchen.tensor.int8_utils import _build_hadamard, _rotate_activation

        xf = _rotate_activation(xf, _build_hadamard(group, dtype=torch.float32), group)
    if int8:
        rowmax = xf.abs().amax(dim=-1, keepdim=True)
        inv = torch.where(rowmax > 0, 127.0 / rowmax, torch.zeros_like(rowmax))
        xf = torch.round(xf * inv).clamp(-127, 127) * torch.where(inv > 0, 1.0 / inv, inv)
    w = q.cpu().float()
    s = scale.cpu().float()
    w = w * (s.reshape(-1, 1) if s.numel() > 1 else s)
    out = (xf.double() @ w.double().t()).float()
    if bias is not None:
        out = out + bias.cpu().float()
    if residual is not None:
        out = residual.cpu().float() + residual_scale.cpu().float() * out
    return out


def metrics(out, ref):
    o = out.detach().cpu().float().reshape(-1)
    r = ref.reshape(-1)
    if r.numel() == 0:
        return {"cos": 1.0, "rel_mae": 0.0, "norm_ratio": 1.0}
    return {
        "cos": F.cosine_similarity(o, r, dim=0).item(),
        "rel_mae": ((o - r).abs().mean() / r.abs().mean()).item(),
        "norm_ratio": (o.norm() / r.norm()).item(),
    }


def counters():
    try:
        from ascend_shim.kitchen.backend import COUNTERS

        c = COUNTERS.as_dict()
        return c["npu_quant"], c["fallback"], c["to_eager"]
    except Exception:
        return 0, 0, 0


def chosen_backend(kwargs):
    try:
        return registry.get_capable_backend("int8_linear", kwargs)
    except Exception as exc:
        return "none: %s" % type(exc).__name__


def quantized_tensor(q, scale, orig_dtype, group=None):
    from comfy_kitchen.tensor import QuantizedTensor, TensorWiseINT8Layout

    params = TensorWiseINT8Layout.Params
    fields = {f.name for f in dataclasses.fields(params)}
    kw = {"scale": scale, "orig_dtype": orig_dtype, "orig_shape": tuple(q.shape)}
    if "is_weight" in fields:
        kw["is_weight"] = True
    if group:
        kw.update(convrot=True, convrot_groupsize=group)
    return QuantizedTensor(q, "TensorWiseINT8Layout", params(**kw))


def scaled_twice(x, scale):
    """What the classic bug returns: the op's output multiplied by both scales again."""
    x_scale = x.cpu().float().abs().amax(dim=-1, keepdim=True) / 127.0
    return lambda out: out.detach().cpu().float() * x_scale * scale.cpu().float().reshape(1, -1)


def measure(name, call, ref=None, weight=None, backend_kwargs=None, double=None, int8_ref=None):
    """Run one call and record what reached the device and how close it came."""
    log = device_log()
    log.reset()
    npu_device.reset_cpu_fallbacks()
    quant_before, fallback_before, eager_before = counters()
    record = {"name": name}
    if backend_kwargs is not None:
        record["backend"] = chosen_backend(backend_kwargs)
    try:
        out = call()
    except Exception as exc:
        record["error"] = "%s: %s" % (type(exc).__name__, exc)
        out = None
    quant_after, fallback_after, eager_after = counters()
    record.update(
        dynamic_quant=log.calls["npu_dynamic_quant"],
        # INT8 linear calls apart from eager's _int_mm on the shim's INT8-cube path (int32 output)
        quant_matmul=log.calls["npu_quant_matmul"] - int_mm_cube_calls(log),
        int_mm_cube=int_mm_cube_calls(log),
        cpu_fallbacks=sorted(npu_device.cpu_fallbacks()),
        served_npu_quant=quant_after - quant_before,
        served_fallback=fallback_after - fallback_before,
        served_eager=eager_after - eager_before,
    )
    if isinstance(out, torch.Tensor):
        record["finite"] = bool(torch.isfinite(out.detach().cpu().float()).all())
    mm = log.last("npu_quant_matmul")
    if mm is not None and weight is not None:
        record["weight_shares_storage"] = mm["x2"].storage_ptr == npu_device.storage_ptr(weight)
        record["weight_passed_transposed"] = mm.notes.get("x2_layout")
    if out is not None:
        record.update(shape=list(out.shape), dtype=str(out.dtype), device=str(out.device))
        if ref is not None:
            record.update(metrics(out, ref))
            if int8_ref is not None:
                record["int8"] = metrics(out, int8_ref)
            if double is not None:  # the check must be able to see a second scaling
                record["scaled_twice"] = metrics(double(out), ref)
    return record


def standard(n=64, k=128, per_channel=True, dtype=torch.bfloat16):
    w = torch.randn(n, k)
    q, scale = quantize_weight(w, per_channel)
    return q.to(NPU), scale.to(NPU)


def warm_up():
    """Unmeasured first: the shim's one-time capability probe (its own test) runs here,
    when the shim's rule is asked (kitchen 0.2.23+) or its backend serves a call."""
    q, scale = standard()
    x = torch.randn(2, 128).to(torch.bfloat16).to(NPU)
    if "ascend_shim" in registry.list_backends():
        registry.validate_backend_for_call("ascend_shim", "int8_linear", dict(
            x=x, weight=q, weight_scale=scale, bias=None, out_dtype=torch.bfloat16))
    ck.int8_linear(x, q, scale, None, torch.bfloat16)


def grid_cases():
    warm_up()
    cases = []
    n, k = 64, 128
    for dims in ((17, k), (2, 9, k)):
        for dtype in (torch.float16, torch.bfloat16):
            for scale_kind in ("scalar", "n", "n1"):
                for with_bias in (False, True):
                    q, scale = standard(n, k, per_channel=scale_kind != "scalar")
                    if scale_kind == "n":
                        scale = scale.reshape(-1)
                    x = torch.randn(*dims).to(dtype).to(NPU)
                    bias = torch.randn(n).to(dtype).to(NPU) if with_bias else None
                    ref = reference(x, q, scale, bias)
                    int8_ref = reference(x, q, scale, bias, int8=True)
                    label = "%dd-%s-%s-%s" % (len(dims), str(dtype)[6:], scale_kind,
                                              "bias" if with_bias else "nobias")
                    kwargs = dict(x=x, weight=q, weight_scale=scale, bias=bias, out_dtype=dtype)
                    cases.append(measure("ck:" + label, lambda: ck.int8_linear(x, q, scale, bias, dtype),
                                         ref, q, kwargs, scaled_twice(x, scale), int8_ref))
                    if scale_kind != "n":  # ComfyUI stores () or [N, 1]
                        qt = quantized_tensor(q, scale, dtype)
                        cases.append(measure("F.linear:" + label, lambda: F.linear(x, qt, bias), ref, q,
                                             int8_ref=int8_ref))
    x = torch.randn(5, 256).to(torch.bfloat16).to(NPU)
    for group in (16, 64, 256):
        w = torch.randn(n, 256)
        from comfy_kitchen.tensor.int8_utils import _build_hadamard, _rotate_weight

        w_rot = _rotate_weight(w, _build_hadamard(group), group)
        q, scale = quantize_weight(w_rot, True)
        q, scale = q.to(NPU), scale.to(NPU)
        ref = reference(x, q, scale, group=group)
        cases.append(measure("ck:convrot-%d" % group,
                             lambda: ck.int8_linear(x, q, scale, None, torch.bfloat16, convrot=True,
                                                    convrot_groupsize=group), ref, q))
        qt = quantized_tensor(q, scale, torch.bfloat16, group)
        cases.append(measure("F.linear:convrot-%d" % group, lambda: F.linear(x, qt), ref, q))
    if "input_act" in PARAMS:
        from comfy_kitchen.backends._activations import INPUT_ACT_TO_CODE

        for act in sorted(a for a in INPUT_ACT_TO_CODE if a not in (None, "none")):
            width = 2 if act in ("swiglu", "situ") else 1
            q, scale = standard(n, k)
            # uniform data: gated activations of Gaussian data are heavy-tailed,
            # which costs any per-token INT8 path (eager's too) over 1% rel-MAE
            x = (torch.rand(3, 7, k * width) * 4 - 2).to(torch.bfloat16).to(NPU)
            act_weight = torch.rand(k * width).to(torch.bfloat16).to(NPU) + 0.5 if act == "rms_norm" else None
            extra = {"input_act": act}
            if act_weight is not None:
                extra.update(input_act_weight=act_weight, input_act_eps=1e-6)
            ref = reference(x, q, scale, act=act, act_weight=act_weight)
            call = functools.partial(ck.int8_linear, x, q, scale, None, torch.bfloat16, **extra)
            before = swiglu_fused_calls()
            call()  # whichever backend serves it: does its activation round once (npu_swiglu)?
            int8_ref = reference(x, q, scale, act=act, act_weight=act_weight, int8=True,
                                 fused=swiglu_fused_calls() > before)
            cases.append(measure("ck:act-" + act, call, ref, q, int8_ref=int8_ref))
    if "residual" in PARAMS:
        q, scale = standard(n, k)
        x = torch.randn(4, 6, k).to(torch.bfloat16).to(NPU)
        bias = torch.randn(n).to(torch.bfloat16).to(NPU)
        residual = torch.randn(4, 6, n).to(torch.bfloat16).to(NPU)
        residual_scale = torch.rand(n).to(torch.bfloat16).to(NPU)
        ref = reference(x, q, scale, bias, residual=residual, residual_scale=residual_scale)
        cases.append(measure("ck:residual", lambda: ck.int8_linear(
            x, q, scale, bias, torch.bfloat16, residual=residual, residual_scale=residual_scale), ref, q))
    if hasattr(ck, "int8_linear_modulated"):  # 0.2.38+: eager reaches _int_mm here too
        q, scale = standard(n, k)
        x = torch.randn(1, 9, k).to(torch.bfloat16).to(NPU)
        modulation = (torch.rand(k) * 0.2).to(torch.bfloat16).to(NPU)
        norm_weight = (torch.rand(k) + 0.5).to(torch.bfloat16).to(NPU)
        modulated = x.cpu().float() * (1 + modulation.cpu().float())
        cases.append(measure("ck:modulated", lambda: ck.int8_linear_modulated(
            x, modulation, q, scale, None, torch.bfloat16), reference(modulated, q, scale), q))
        normed = F.rms_norm(x.cpu().float(), (k,), norm_weight.cpu().float(), 1e-6)
        cases.append(measure("ck:rms-modulated", lambda: ck.int8_linear_rms_modulated(
            x, norm_weight, 1e-6, modulation, q, scale, None, torch.bfloat16),
            reference(normed * (1 + modulation.cpu().float()), q, scale), q))
    return cases


@contextlib.contextmanager
def future_kitchen():
    """A newer comfy-kitchen: its backends' int8_linear take ``future_option`` (neutral
    0), an option this shim predates."""
    originals = {}
    for name in ("eager", "ascend"):
        module = registry._backends.get(name)
        if module is not None:
            originals[name] = module.int8_linear
            module.int8_linear = taking_future_option(module.int8_linear)
    try:
        yield
    finally:
        for name, original in originals.items():
            registry._backends[name].int8_linear = original


def taking_future_option(int8_linear):
    def future_int8_linear(*args, future_option=0, **kwargs):
        return int8_linear(*args, **kwargs)

    return future_int8_linear


@contextlib.contextmanager
def warnings_counted(text):
    """The shim's log records containing ``text``."""
    seen = []

    class Handler(logging.Handler):
        def emit(self, record):
            if text in record.getMessage():
                seen.append(record.getMessage())

    handler = Handler()
    logging.getLogger("ascend_shim").addHandler(handler)
    try:
        yield seen
    finally:
        logging.getLogger("ascend_shim").removeHandler(handler)


def bad_cases():
    """Inputs the NPU INT8 path must decline: never a wrong number or a CPU fallback."""
    n, k = 64, 128
    q, scale = standard(n, k)
    cases = []

    def case(name, x, weight=q, weight_scale=scale, bias=None, ref=True, **extra):
        kwargs = dict(x=x, weight=weight, weight_scale=weight_scale, bias=bias,
                      out_dtype=torch.bfloat16, **extra)
        device_log().reset()
        try:
            verdict = registry.validate_backend_for_call("ascend_shim", "int8_linear", kwargs)
            validation = {"success": verdict.success, "param": verdict.failed_param}
        except Exception as exc:  # must never happen
            validation = {"raised": "%s: %s" % (type(exc).__name__, exc)}
        # kernels run while deciding (the one-time capability probe)
        validation["kernels"] = sum(device_log().calls.values())
        expected = None
        if ref:
            expected = reference(x, weight.cpu(), weight_scale.cpu(), bias)
        public = {key: value for key, value in extra.items() if key in PARAMS}
        if len(public) == len(extra):
            call = lambda: ck.int8_linear(x, weight, weight_scale, bias, torch.bfloat16, **public)
        else:  # a keyword this kitchen's public wrapper lacks: go through the registry
            call = lambda: registry.get_implementation("int8_linear", kwargs=kwargs)(**kwargs)
        record = measure(name, call, expected, weight, kwargs)
        record["validation"] = validation
        cases.append(record)

    x = torch.randn(9, k)
    xb = x.to(torch.bfloat16).to(NPU)
    case("first-call", xb)  # probes the stack once: 4 tiny calls of each op more
    case("second-call", xb)
    case("fp32-x", x.to(NPU))
    case("k-mismatch", torch.randn(9, k + 8).to(torch.bfloat16).to(NPU), ref=False)
    case("empty-input", torch.randn(0, k).to(torch.bfloat16).to(NPU))
    case("scale-wrong-size", x.to(torch.bfloat16).to(NPU), weight_scale=torch.rand(n + 1).to(NPU), ref=False)
    case("bias-wrong-size", x.to(torch.bfloat16).to(NPU), bias=torch.randn(n + 3).to(torch.bfloat16).to(NPU),
         ref=False)
    case("cpu-weight", x.to(torch.bfloat16).to(NPU), weight=q.cpu(), weight_scale=scale.cpu())
    case("1d-x", torch.randn(k).to(torch.bfloat16).to(NPU))
    wide_k = 65536 + 64
    big_q, big_scale = quantize_weight(torch.randn(8, wide_k), True)
    case("k-over-65535", torch.randn(2, wide_k).to(torch.bfloat16).to(NPU), weight=big_q.to(NPU),
         weight_scale=big_scale.to(NPU))
    case("bias-1-1-n", xb, bias=torch.randn(1, 1, n).to(torch.bfloat16).to(NPU))
    case("int-bias", xb, bias=torch.randint(-4, 5, (n,), dtype=torch.int32).to(NPU))
    # a 1-D x is declined by the INT8 path, so the fallback computes it; 127 * 1000 overflows fp16
    case("fallback-fp16-x-scale-1000", x[0].to(torch.float16).to(NPU),
         weight_scale=torch.full((n, 1), 1000.0).to(NPU))
    with future_kitchen(), warnings_counted("unknown to this ascend_shim") as seen:
        case("unknown-keyword", xb, future_option=3)
        case("unknown-keyword-again", xb, future_option=3)
    cases[-1]["unknown_warnings"] = len(seen)
    if "input_act" in PARAMS:
        case("unknown-input-act", x.to(torch.bfloat16).to(NPU), ref=False, input_act="relu6")
    wide = torch.randn(9, 2 * k).to(torch.bfloat16).to(NPU)
    case("non-contiguous-x", wide[:, ::2])
    bf16_scale = scale.to(torch.bfloat16)
    case("bf16-weight-scale", x.to(torch.bfloat16).to(NPU), weight_scale=bf16_scale)
    return cases


def policy_cases():
    warm_up()
    q, scale = standard()
    x = torch.randn(12, 128).to(torch.bfloat16).to(NPU)
    ref = reference(x, q, scale)
    cases = [measure("standard", lambda: ck.int8_linear(x, q, scale, None, torch.bfloat16), ref, q,
                     dict(x=x, weight=q, weight_scale=scale, out_dtype=torch.bfloat16))]
    xf = x.float()
    cases.append(measure("fp32-x", lambda: ck.int8_linear(xf, q, scale, None, torch.bfloat16), ref, q,
                         dict(x=xf, weight=q, weight_scale=scale, out_dtype=torch.bfloat16)))
    s16 = scale.to(torch.bfloat16)
    cases.append(measure("bf16-scale", lambda: ck.int8_linear(x, q, s16, None, torch.bfloat16), ref, q,
                         dict(x=x, weight=q, weight_scale=s16, out_dtype=torch.bfloat16)))
    return cases


def mm_int8_cases():
    if not hasattr(ck, "mm_int8"):
        return []
    a = torch.randint(-128, 128, (33, 3000), dtype=torch.int8)
    b = torch.randint(-128, 128, (3000, 40), dtype=torch.int8)
    exact = (a.long() @ b.long()).to(torch.int32)
    record = measure("mm_int8", lambda: ck.mm_int8(a.to(NPU), b.to(NPU)))
    out = ck.mm_int8(a.to(NPU), b.to(NPU))
    record["exact"] = bool(torch.equal(out.cpu(), exact))
    # float operands: eager asserts int8, which python -O strips
    af, bf = torch.tensor([[2.3]]).to(NPU), torch.tensor([[1.0]]).to(NPU)
    floats = measure("mm_int8-float", lambda: ck.mm_int8(af, bf))
    floats["optimize"] = sys.flags.optimize
    return [record, floats]


def stack_cases():
    """A stack that cannot run the INT8 path: every call still served, on the device."""
    q, scale = standard()
    x = torch.randn(12, 128).to(torch.bfloat16).to(NPU)
    ref = reference(x, q, scale)
    kwargs = dict(x=x, weight=q, weight_scale=scale, out_dtype=torch.bfloat16)
    return [measure(name, lambda: ck.int8_linear(x, q, scale, None, torch.bfloat16), ref, q, kwargs)
            for name in ("first-call", "second-call")]


def input_error_cases():
    """An op that refuses an input the contract let through (a lower K limit than
    documented): that call is served by the fallback, and only that call."""
    import os

    os.environ["TESTBED_QMM_MAX_DIM"] = "100"  # read by the bed at every call
    cases = []
    for name, k in (("k-128-refused-by-op", 128), ("k-64", 64), ("k-128-again", 128), ("k-64-again", 64)):
        q, scale = standard(64, k)
        x = torch.randn(5, k).to(torch.bfloat16).to(NPU)
        cases.append(measure(name, lambda: ck.int8_linear(x, q, scale, None, torch.bfloat16),
                             reference(x, q, scale), q))
    return cases


def main():
    suites = {"grid": grid_cases, "bad": bad_cases, "policy": policy_cases,
              "disabled": policy_cases, "mm_int8": mm_int8_cases, "input_errors": input_error_cases,
              "old_signature": stack_cases, "opaque_signature": stack_cases}
    # under inference_mode, as ComfyUI runs every node: there aten::linear reaches kitchen's
    # QuantizedTensor whole; outside it decomposes, and torch_npu's own aten::matmul kernel takes
    # a bias-free product whole (kitchen handles linear/mm/addmm, not matmul, and dequantizes)
    with torch.inference_mode():
        cases = suites[SUITE]()
    report = None
    if "ascend_shim.engine.runner" in sys.modules:  # the engine started
        try:
            import ascend_shim

            report = ascend_shim.status()["int8"]
        except Exception as exc:
            report = {"error": repr(exc)}
    backends = {name: info for name, info in registry.list_backends().items() if name.startswith("ascend")}
    print(json.dumps({"cases": cases, "report": report, "priority": list(registry._priority),
                      "backends": backends}))


main()
