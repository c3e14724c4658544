"""``python -m ascend_shim selftest``: does INT8 really run on this NPU, and right?

1. The check from the user's report: bf16 activations and an int8 weight
   through ``npu_dynamic_quant`` + ``npu_quant_matmul``; shape, dtype, device.
2. The shim's INT8 linear against a float32 dequantized reference on a few
   layer shapes: cosine >= 0.9999 and relative MAE <= 2 %.
3. Through comfy-kitchen when installed: which backend served, and that no op
   fell back to the CPU.

Exit status: 0 passed, 1 failed, 3 no NPU here.
"""

import json
import warnings

NO_NPU = 3
COSINE_MIN = 0.9999
REL_MAE_MAX = 0.02
SHAPES = ((64, 3840, 3840), (17, 3840, 1024), (128, 1024, 3840))


def quantized_weight(n, k, device):
    import torch

    w = torch.randn(n, k)
    scale = (w.abs().amax(dim=1, keepdim=True) / 127.0).clamp(min=1e-8)
    q = torch.round(w / scale).clamp(-127, 127).to(torch.int8)
    return q.to(device), scale.to(device)


def compare(out, reference):
    import torch

    o = out.detach().float().cpu().reshape(-1)
    r = reference.detach().float().cpu().reshape(-1)
    return {"cosine": torch.nn.functional.cosine_similarity(o, r, dim=0).item(),
            "rel_mae": ((o - r).abs().mean() / r.abs().mean()).item()}


def _fallbacks(caught):
    from ascend_shim.fallback_report import PATTERN

    return sorted({m.group(1) for w in caught for m in [PATTERN.search(str(w.message))] if m})


def report_check(torch, torch_npu, device):
    x = torch.randn(128, 2048, dtype=torch.bfloat16, device=device)
    w = torch.randint(-127, 128, (2048, 2048), dtype=torch.int8, device=device)
    scale = torch.full((2048,), 0.01, dtype=torch.float32, device=device)
    x8, x_scale = torch_npu.npu_dynamic_quant(x)
    y = torch_npu.npu_quant_matmul(x8, w.t(), scale, pertoken_scale=x_scale.reshape(-1).float(),
                                   output_dtype=torch.bfloat16)
    ok = tuple(y.shape) == (128, 2048) and y.dtype == torch.bfloat16 and y.device.type == "npu"
    return {"name": "dynamic quant + quant matmul", "shape": list(y.shape), "dtype": str(y.dtype),
            "device": str(y.device), "passed": ok}


def layer_check(torch, torch_npu, device, m, k, n):
    from ascend_shim.kitchen import int8_math

    q, scale = quantized_weight(n, k, device)
    x = torch.randn(m, k, dtype=torch.bfloat16, device=device)
    out = int8_math.npu_quant_linear(x, q, scale, None, torch.bfloat16, torch_npu)
    reference = x.float().cpu() @ (q.float().cpu() * scale.float().cpu()).t()
    result = {"name": "int8_linear M=%d K=%d N=%d" % (m, k, n)}
    result.update(compare(out, reference))
    result["passed"] = result["cosine"] >= COSINE_MIN and result["rel_mae"] <= REL_MAE_MAX
    return result


def kitchen_check(torch, device):
    try:
        import comfy_kitchen as ck
    except ImportError:
        return None
    if not hasattr(ck, "int8_linear"):
        return {"name": "comfy-kitchen int8_linear", "passed": True, "note": "this kitchen has no int8_linear"}
    q, scale = quantized_weight(256, 1024, device)
    x = torch.randn(32, 1024, dtype=torch.bfloat16, device=device)
    kwargs = dict(x=x, weight=q, weight_scale=scale, bias=None, out_dtype=torch.bfloat16)
    backend = ck.registry.get_capable_backend("int8_linear", kwargs)
    out = ck.int8_linear(x, q, scale, None, torch.bfloat16)
    reference = x.float().cpu() @ (q.float().cpu() * scale.float().cpu()).t()
    result = {"name": "comfy-kitchen int8_linear", "backend": backend}
    result.update(compare(out, reference))
    result["passed"] = (backend != "eager" and result["cosine"] >= COSINE_MIN
                        and result["rel_mae"] <= REL_MAE_MAX)
    return result


def run():
    from ascend_shim._npu import npu_reason

    reason = npu_reason()
    if reason:
        return {"npu": False, "reason": reason, "checks": [], "passed": False}
    import torch
    import torch_npu

    torch.manual_seed(0)
    device = torch.device("npu", torch.npu.current_device())
    checks = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        checks.append(report_check(torch, torch_npu, device))
        for m, k, n in SHAPES:
            checks.append(layer_check(torch, torch_npu, device, m, k, n))
        kitchen = kitchen_check(torch, device)
        if kitchen is not None:
            checks.append(kitchen)
        torch.npu.synchronize()
    fallbacks = _fallbacks(caught)
    checks.append({"name": "no CPU fallback", "fallbacks": fallbacks, "passed": not fallbacks})
    return {"npu": True, "device": torch.npu.get_device_name(device.index), "torch_npu": torch_npu.__version__,
            "checks": checks, "passed": all(c["passed"] for c in checks)}


def main(options):
    result = run()
    if options.json:
        print(json.dumps(result, indent=2, default=str))
    elif not result["npu"]:
        print("selftest needs an Ascend NPU: %s" % result["reason"])
    else:
        print("selftest on %s (torch_npu %s)" % (result["device"], result["torch_npu"]))
        for check in result["checks"]:
            detail = ", ".join("%s=%s" % (k, ("%.6f" % v) if isinstance(v, float) else v)
                               for k, v in check.items() if k not in ("name", "passed"))
            print("  [%s] %s  %s" % ("PASS" if check["passed"] else "FAIL", check["name"], detail))
        print("thresholds: cosine >= %s, relative MAE <= %.0f%%" % (COSINE_MIN, REL_MAE_MAX * 100))
    if not result["npu"]:
        return NO_NPU
    return 0 if result["passed"] else 1
