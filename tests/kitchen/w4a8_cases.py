"""W4A8 linear cases on the simulated NPU, for one real comfy-kitchen release (0.2.27+).

Run in a fresh interpreter on the test bed (``ASCEND_TESTBED=ascend-cu130``,
the kitchen release on PYTHONPATH, the shim installed in the venv). Prints
one JSON object; the assertions live in ``test_w4a8.py``. Every reference is
kitchen's own eager ``w4a8_int8_linear`` on the CPU, on the same weights.

    python w4a8_cases.py [shapes|declined]
"""

import inspect
import json
import sys
import warnings

import torch
import torch_npu  # noqa: F401  (registers the npu device, as on a real box)

import comfy_kitchen as ck  # noqa: E402
from testbed import npu_device  # noqa: E402

SUITE = sys.argv[1] if len(sys.argv) > 1 else "shapes"
PARAMS = set(inspect.signature(ck.quantize_w4a8_int8_weight).parameters)
warnings.simplefilter("ignore")
torch.manual_seed(0)

# (M, K, N, x dims, bias): model-like K/N 1024-12288 and M 1-4096, few enough for 2 CPU cores
SHAPES = [
    (1, 1024, 1024, 2, False),
    (4096, 1024, 1024, 2, True),
    (77, 3072, 1024, 3, True),
    (16, 12288, 1024, 2, False),
    (8, 1024, 12288, 3, True),
]


def quantized(n, k, **options):
    weight = torch.randn(n, k) * 0.02
    qdata, s_rel, s_channel, correction, codebook = ck.quantize_w4a8_int8_weight(weight, **options)
    return {"qdata": qdata, "s_rel": s_rel.float(), "s_channel": s_channel, "codebook": codebook,
            "correction": correction}


def on_npu(tensors):
    return {k: (v.npu() if isinstance(v, torch.Tensor) else v) for k, v in tensors.items()}


def counters():
    from ascend_shim.kitchen import w4a8

    return w4a8.report()


def cosine(a, b):
    return float(torch.nn.functional.cosine_similarity(a.float().flatten(), b.float().flatten(), dim=0))


def run_case(name, x, weight, **options):
    """One call on CPU (eager) and on the NPU (whatever kitchen selects)."""
    want = ck.w4a8_int8_linear(x, **weight, **options)
    npu_options = on_npu(options)
    before = counters()
    npu_device.reset_cpu_fallbacks()
    torch_npu._testbed.reset()
    got = ck.w4a8_int8_linear(x.npu(), **on_npu(weight), **npu_options)
    after = counters()
    int_mm_cube = sum(1 for r in torch_npu._testbed.records
                      if r.op == "npu_quant_matmul" and r.options.get("output_dtype") == torch.int32)
    return {
        "name": name,
        "device": str(got.device),
        "shape": list(got.shape),
        "want_shape": list(want.shape),
        "dtype": str(got.dtype),
        "cos": cosine(got.cpu(), want),
        "cpu_fallbacks": sorted(npu_device.cpu_fallbacks()),
        "dynamic_quant": torch_npu._testbed.calls["npu_dynamic_quant"],
        # W4A8 calls apart from eager's _int_mm on the shim's INT8-cube path (int32 output)
        "quant_matmul": torch_npu._testbed.calls["npu_quant_matmul"] - int_mm_cube,
        "int_mm_cube": int_mm_cube,
        "served_npu_quant": after["npu_quant"] - before["npu_quant"],
        "declined": sorted(set(after["declined"]) - set(before["declined"])
                           | {k for k, v in after["declined"].items()
                              if v["count"] != before["declined"].get(k, {}).get("count")}),
    }


def warm_up():
    """The first NPU call probes the quant ops once; keep that out of the counts."""
    weight = quantized(64, 256)
    ck.w4a8_int8_linear(torch.randn(2, 256, dtype=torch.bfloat16).npu(), **on_npu(weight))


def shapes():
    cases = []
    for m, k, n, dims, with_bias in SHAPES:
        weight = quantized(n, k)
        x = torch.randn(*(((2, m // 2) if m % 2 == 0 else (1, m)) if dims == 3 else (m,)), k,
                        dtype=torch.bfloat16)
        bias = torch.randn(n, dtype=torch.bfloat16) if with_bias else None
        cases.append(run_case("M%d K%d N%d %dD%s" % (m, k, n, dims, " bias" if with_bias else ""),
                              x, weight, bias=bias))
    weight = quantized(512, 1024, codebook=False)
    cases.append(run_case("uniform codes", torch.randn(9, 1024, dtype=torch.float16), weight,
                          out_dtype=torch.float16))
    weight = quantized(256, 1024, convrot_groupsize=64)
    cases.append(run_case("convrot 64", torch.randn(9, 1024, dtype=torch.bfloat16), weight,
                          convrot_groupsize=64))
    return cases


def declined():
    cases = []
    weight = quantized(256, 1024)
    groups = 1024 // 16
    correction = torch.randn(groups, 256) * 1e-3
    cases.append(run_case("correction", torch.randn(5, 1024, dtype=torch.bfloat16),
                          dict(weight, correction=correction)))
    cases.append(run_case("fp32 x", torch.randn(5, 1024), weight))
    if "bits" in PARAMS:
        six = quantized(256, 1024, bits=6)
        cases.append(run_case("6-bit", torch.randn(5, 1024, dtype=torch.bfloat16), six))
    # bad input: eager's own error type, on both devices
    errors = {}
    for label, device in (("cpu", "cpu"), ("npu", "npu")):
        x = torch.randn(5, 512, dtype=torch.bfloat16, device=device)
        w = weight if device == "cpu" else on_npu(weight)
        try:
            ck.w4a8_int8_linear(x, **w)
            errors[label] = None
        except Exception as exc:
            errors[label] = type(exc).__name__
    # a future option: declined by the rule (never a NotImplementedError)
    from ascend_shim.kitchen import w4a8

    kwargs = dict(x=torch.randn(5, 1024, dtype=torch.bfloat16).npu(), **on_npu(weight))
    rule_plain = ck.registry.get_implementation("w4a8_int8_linear", kwargs=kwargs)
    rule_future = ck.registry.get_implementation(
        "w4a8_int8_linear", kwargs=dict(kwargs, future_option=3))
    rule_neutral = ck.registry.get_implementation(
        "w4a8_int8_linear", kwargs=dict(kwargs, future_option=None))
    eager = ck.registry.get_implementation("w4a8_int8_linear", backend="eager")
    return {"cases": cases, "errors": errors,
            "future": {"plain_is_shim": getattr(rule_plain, "__self__", None) is not None
                       and type(rule_plain.__self__) is w4a8.W4A8Linear,
                       "future_is_eager": rule_future is eager,
                       "neutral_is_shim": rule_neutral == rule_plain}}


warm_up()
result = {"shapes": lambda: {"cases": shapes()}, "declined": declined}[SUITE]()
result["report"] = counters()
print(json.dumps(result))
