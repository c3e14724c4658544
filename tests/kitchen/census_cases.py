"""Census: every public INT8-family function of one comfy-kitchen release, on NPU tensors.

Run in a fresh interpreter on the test bed with the shim installed and the
release on PYTHONPATH. For each public function whose name says INT8/INT4
(plus ``mm_int8`` and the W4A8 packed path, which kitchen does not list) it
builds inputs, calls it on the CPU (eager: the reference) and on the NPU,
and records the CPU fallbacks and whether the numbers agree. A function the
bed cannot build inputs for is recorded as ``not_built`` with the reason;
nothing is left out silently. Prints one JSON object; ``test_census.py``
asserts on it.
"""

import inspect
import json
import re
import warnings

import torch
import torch_npu  # noqa: F401  (the simulated device)

import comfy_kitchen as ck  # noqa: E402
from testbed import npu_device  # noqa: E402

warnings.simplefilter("ignore")
FAMILY = re.compile(r"int8|int4|w4a8|w4a4|convrot")
# integer outputs may differ by one code (the NPU op rounds a multiply,
# eager a divide, as torch_npu's kernel and kitchen's eager do); float outputs by the INT8 path's own error
MAX_CODE_STEP = 1
MIN_COSINE = 0.999
N, K, M = 64, 256, 8


def public_family():
    names = getattr(ck, "__all__", None) or [n for n in dir(ck) if not n.startswith("_")]
    found = {n for n in names if FAMILY.search(n) and callable(getattr(ck, n, None))}
    if hasattr(ck, "mm_int8"):
        found.add("mm_int8")
    if "mma_packed" in inspect.signature(getattr(ck, "w4a8_int8_linear", lambda: None)).parameters:
        found.add("w4a8_int8_linear(mma_packed=True)")
    return sorted(found)


def accepts(function, name):
    return name in inspect.signature(function).parameters


def bf16(*shape):
    return torch.randn(*shape, dtype=torch.bfloat16)


def int8_weight():
    w = torch.randn(N, K)
    scale = w.abs().amax() / 127
    return (w / scale).round().clamp(-127, 127).to(torch.int8), scale.float()


def w4a8_weight():
    options = {"scale_dtype": torch.float32} if accepts(ck.quantize_w4a8_int8_weight, "scale_dtype") else {}
    qdata, s_rel, s_channel, _correction, codebook = ck.quantize_w4a8_int8_weight(torch.randn(N, K) * 0.02, **options)
    return dict(qdata=qdata, s_rel=s_rel.float(), s_channel=s_channel, codebook=codebook)


def w4a4_weight():
    qweight, wscales = ck.quantize_convrot_w4a4_weight(torch.randn(N, K))
    return qweight, wscales


def svdquant_activations():
    rank = 32
    return (bf16(M, K), torch.rand(K, dtype=torch.bfloat16) + 0.5, bf16(K, rank))


def svdquant_mm():
    """Activations from kitchen's own quantizer; any packed int4 bytes are a valid weight."""
    act, ascales, lora_act = ck.quantize_svdquant_w4a4(*svdquant_activations())
    rank = lora_act.shape[-1]
    weight = torch.randint(-128, 128, (N, K // 2), dtype=torch.int8)
    wscales = torch.rand(K // 64, N, dtype=torch.bfloat16) * 0.01
    return (act, weight, ascales, wscales, lora_act, bf16(N, rank)), {}


# name -> builder returning (args, kwargs), or a string: why the bed cannot build inputs
def builders():
    w8, s8 = int8_weight()
    table = {
        "int8_linear": lambda: ((bf16(M, K), w8, s8), {}),
        "int8_linear_modulated": lambda: ((bf16(M, K), torch.randn(K).to(torch.bfloat16) * 0.1, w8, s8), {}),
        "int8_linear_rms_modulated": lambda: ((bf16(M, K), torch.ones(K, dtype=torch.bfloat16), 1e-6,
                                               torch.randn(K).to(torch.bfloat16) * 0.1, w8, s8), {}),
        "mm_int8": lambda: ((torch.randint(-128, 128, (M, 2048), dtype=torch.int8),
                             torch.randint(-128, 128, (2048, 24), dtype=torch.int8)), {}),
        "quantize_int8_rowwise": lambda: ((bf16(M, K),), {}),
        "quantize_int8_tensorwise": lambda: ((bf16(M, K),), {}),
        "dequantize_int8_simple": lambda: ((w8, s8), {}),
        "quantize_convrot_w4a4_weight": lambda: ((torch.randn(N, K),), {}),
        "dequantize_convrot_w4a4_weight": lambda: (w4a4_weight(), {}),
        "convrot_w4a4_linear": lambda: ((bf16(M, K), *w4a4_weight()), {}),
        "quantize_w4a8_int8_weight": lambda: ((torch.randn(N, K) * 0.02,),
                                              {"scale_dtype": torch.float32}),
        "dequantize_w4a8_int8_weight": lambda: ((), w4a8_weight()),
        "w4a8_int8_linear": lambda: ((bf16(M, K),), w4a8_weight()),
        "w4a8_int8_linear(mma_packed=True)":
            "packed W4A8 records are built only by kitchen's CUDA backend (pack_w4a8_mma_weight_)",
        "quantize_svdquant_w4a4": lambda: (svdquant_activations(), {}),
        "scaled_mm_svdquant_w4a4": svdquant_mm,
        "int8_attention_is_available": lambda: ((), {}),
        "prequantize_int8_attention": lambda: ((bf16(1, 2, 16, 64), bf16(1, 2, 16, 64), bf16(1, 2, 16, 64)), {}),
        "int8_attention_from_prequantized":
            "its input is prequantize_int8_attention's result, which no release builds off CUDA",
        "int8_attention": lambda: ((bf16(1, 2, 16, 64), bf16(1, 2, 16, 64), bf16(1, 2, 16, 64)), {}),
    }
    if "scale_dtype" not in inspect.signature(getattr(ck, "quantize_w4a8_int8_weight", bf16)).parameters:
        table["quantize_w4a8_int8_weight"] = lambda: ((torch.randn(N, K) * 0.02,), {})
    return table


def to_npu(value):
    if isinstance(value, torch.Tensor):
        return value.npu()
    if isinstance(value, (tuple, list)):
        return type(value)(to_npu(v) for v in value)
    if isinstance(value, dict):
        return {k: to_npu(v) for k, v in value.items()}
    return value


def tensors(value):
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (tuple, list)):
        return [t for v in value for t in tensors(v)]
    return []


def agree(want, got):
    """(agree?, what was measured) for each tensor output, CPU vs NPU."""
    if not tensors(want) and not tensors(got):  # e.g. an is_available() answer
        return want == got, repr(got)
    want, got = tensors(want), tensors(got)
    if len(want) != len(got):
        return False, "%d outputs vs %d" % (len(got), len(want))
    measured = []
    for a, b in zip(want, got):
        if b.device.type != "npu" or a.shape != b.shape or a.dtype != b.dtype:
            return False, "got %s %s %s, want %s %s" % (b.device, b.dtype, list(b.shape), a.dtype, list(a.shape))
        b = b.cpu()
        if a.dtype.is_floating_point:
            if a.numel() <= 1:
                ok = torch.allclose(a.float(), b.float(), rtol=1e-2)
                measured.append("close" if ok else "%s vs %s" % (a.item(), b.item()))
            else:
                cos = float(torch.nn.functional.cosine_similarity(a.float().flatten(), b.float().flatten(), dim=0))
                ok = cos >= MIN_COSINE
                measured.append("cos %.6f" % cos)
        else:
            step = int((a.long() - b.long()).abs().max()) if a.numel() else 0
            ok = step <= MAX_CODE_STEP
            measured.append("max step %d" % step)
        if not ok:
            return False, measured
    return True, measured


def census():
    results = {}
    table = builders()
    for name in public_family():
        build = table.get(name)
        if build is None:
            results[name] = {"status": "not_built", "reason": "the census has no inputs for it yet"}
            continue
        if isinstance(build, str):
            results[name] = {"status": "not_built", "reason": build}
            continue
        function = ck.w4a8_int8_linear if name.startswith("w4a8_int8_linear") else getattr(ck, name)
        torch.manual_seed(0)
        args, kwargs = build()
        try:
            want = function(*args, **kwargs)
        except Exception as exc:  # no implementation here at all (CUDA-only)
            want = exc
        npu_device.reset_cpu_fallbacks()
        try:
            got = function(*to_npu(args), **to_npu(kwargs))
        except Exception as exc:
            same = isinstance(want, Exception) and type(want) is type(exc)
            results[name] = {"status": "refused_on_cpu_too" if same else "error",
                             "reason": "%s: %s" % (type(exc).__name__, exc),
                             "cpu_fallbacks": sorted(npu_device.cpu_fallbacks())}
            continue
        if isinstance(want, Exception):
            results[name] = {"status": "error", "reason": "CPU raised %r, NPU did not" % want}
            continue
        ok, measured = agree(want, got)
        results[name] = {"status": "ok", "agree": ok, "measured": measured,
                         "cpu_fallbacks": sorted(npu_device.cpu_fallbacks())}
    return results


print(json.dumps({"version": getattr(ck, "__version__", None), "functions": census()}))
