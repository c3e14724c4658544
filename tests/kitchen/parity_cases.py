"""Parity of the shim's backends with comfy-kitchen's eager, over a generated grid.

Run in a fresh interpreter on the test bed (``ASCEND_TESTBED=ascend-cu130``,
the kitchen release on PYTHONPATH, the shim installed in the venv, normally
``ASCEND_SHIM_INT8=shim`` so the shim's backends see every NPU call first).
The functions are those the shim registered with kitchen's registry (read
from the registry, not listed here). For each, a few valid base calls are
varied one argument at a time: every tensor argument over dtypes, dims,
sizes, layout and device (left on the CPU), every option over valid and
invalid values, every optional tensor left out. Each grid point is called
through kitchen's public function on NPU tensors and on CPU tensors (where
only eager serves); the script prints both outcomes (result or exception
class) and how far the results are apart. ``test_parity.py`` asserts.

    python parity_cases.py
"""

import time

START = time.perf_counter()  # noqa: E402  (the report's seconds include startup)

import inspect  # noqa: E402
import json  # noqa: E402
import sys  # noqa: E402
import warnings  # noqa: E402

import torch  # noqa: E402
import torch_npu  # noqa: F401  (registers the npu device, as on a real box)

import comfy_kitchen as ck  # noqa: E402

warnings.simplefilter("ignore")
SHIM_BACKENDS = ("ascend_shim", "ascend_shim_fallback", "ascend_shim_rope")
M, K, N = 3, 64, 32
W4A8_GROUP = 16  # ConvRot group of the W4A8 weights (a power of four dividing K)
PACKED_K = 256  # packed W4A8 records hold 256 of K

DTYPES = (torch.bool, torch.uint8, torch.int8, torch.int32, torch.int64, torch.float16,
          torch.bfloat16, torch.float32, torch.float64)
# non-tensor arguments: valid and invalid values, by parameter name
OPTIONS = {
    "out_dtype": (None, torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.int8,
                  torch.bool, "bfloat16"),
    "convrot": (False, True, 1, None),
    "convrot_groupsize": (4, 16, 64, 256, 12, 16.0, None),
    "group_size": (16, 8, 32, 12, 16.0),
    "input_act": (None, "none", "gelu_tanh", "swiglu", "situ", "rms_norm", "bogus"),
    "input_act_eps": (0.0, 1e-6, 0, None),
    "norm_eps": (1e-6, 0.0, 1, None),
    "epsilon": (1e-6, 0.0, 1, None),
    "rot_dim": (0, 4, 2, 3, 8, 10, -2, None),
}
# RoPE: heads, sequence, head dim of the base calls
ROPE_H, ROPE_L, ROPE_D = 2, 4, 8


def short(dtype):
    return str(dtype).replace("torch.", "")


# -- tensor variants: functions of the base tensor, applied on either device ------

def strided(t):
    """The same values as a view with gaps between elements."""
    return torch.stack([t, torch.zeros_like(t)], dim=-1)[..., 0]


def tensor_variants(t):
    out = {"dtype=" + short(d): (lambda v, d=d: v.to(d)) for d in DTYPES if d != t.dtype}
    out["dims+1"] = lambda v: v.unsqueeze(0)
    if t.dim() >= 1:
        out["drop-dim0"] = lambda v: v[0]
        out["last-1"] = lambda v: v[..., :-1]
        out["empty"] = lambda v: v[:0]
        out["strided"] = strided
    if t.dim() != 1:
        out["flat"] = lambda v: v.reshape(-1)
    if t.numel() == 1:
        out["0-d"] = lambda v: v.reshape(())
    out["on-cpu"] = None  # left on the CPU while the others go to the NPU
    return out


# -- base calls per function --------------------------------------------------------

def bf16(*shape):
    return torch.randn(*shape).to(torch.bfloat16)


def int8_weight(n=N, k=K):
    return (torch.randint(-127, 128, (n, k), dtype=torch.int8),
            (torch.rand(n, 1) * 0.002 + 0.001).float())


def int8_bases(params):
    """Valid ``int8_linear`` calls; the first is varied in every argument."""
    w, s = int8_weight()
    bases = [dict(x=bf16(M, K), weight=w, weight_scale=s, bias=bf16(N), out_dtype=torch.bfloat16,
                  convrot=False, convrot_groupsize=256),
             dict(x=torch.randn(2, M, K).half(), weight=w, weight_scale=s.reshape(-1)[:1].reshape(()),
                  out_dtype=torch.float16),
             dict(x=torch.randn(M, K), weight=w, weight_scale=s.reshape(-1), bias=torch.randn(N)),
             dict(x=bf16(M, K), weight=w, weight_scale=s, bias=bf16(N), convrot=True, convrot_groupsize=16)]
    if "input_act" in params:
        bases += [dict(x=bf16(M, 2 * K), weight=w, weight_scale=s, input_act="swiglu"),
                  dict(x=bf16(M, K), weight=w, weight_scale=s, input_act="gelu_tanh")]
    if "input_act_weight" in params:
        bases.append(dict(x=bf16(M, K), weight=w, weight_scale=s, input_act="rms_norm",
                          input_act_weight=bf16(K), input_act_eps=1e-6))
    if "residual" in params:
        bases.append(dict(x=bf16(M, K), weight=w, weight_scale=s, bias=bf16(N), residual=bf16(M, N),
                          residual_scale=bf16(N)))
    return bases


def modulated_bases(params):
    w, s = int8_weight()
    base = dict(x=bf16(M, K), modulation_scale=bf16(K) * 0.1, weight=w, weight_scale=s, bias=bf16(N),
                out_dtype=torch.bfloat16, convrot=False, convrot_groupsize=256)
    if "norm_weight" in params:
        base.update(norm_weight=bf16(K), norm_eps=1e-6)
    return [base, dict(base, convrot=True, convrot_groupsize=64, x=torch.randn(M, K).half(),
                       out_dtype=torch.float16, bias=None)]


def w4a8_operands(**options):
    weight = torch.randn(N, K) * 0.02
    qdata, s_rel, s_channel, correction, codebook = ck.quantize_w4a8_int8_weight(weight, **options)
    return dict(qdata=qdata, s_rel=s_rel.float(), s_channel=s_channel, codebook=codebook)


def w4a8_bases(params):
    base = dict(x=bf16(M, K), **w4a8_operands(convrot_groupsize=W4A8_GROUP), bias=bf16(N),
                out_dtype=torch.bfloat16, convrot_groupsize=W4A8_GROUP)
    bases = [base, dict(base, x=torch.randn(2, M, K).half(), out_dtype=torch.float16, bias=None),
             dict(base, correction=torch.randn(K // 16, N) * 1e-3)]
    if "input_act" in params:
        bases.append(dict(base, x=bf16(M, 2 * K), input_act="swiglu"))
    if "residual" in params:
        bases.append(dict(base, residual=bf16(M, N), residual_scale=bf16(N)))
    return bases


def packed_record(n=N, k=PACKED_K):
    """A 4-bit packed W4A8 weight: any code bytes, fp8 scale bytes of 0.5 to 2."""
    from comfy_kitchen.tensor import w4a8_packed

    record = w4a8_packed.w4a8_mma_record_bytes(4)
    records = torch.randint(-128, 128, (n // 16, k // 32, record), dtype=torch.int8)
    scale_bytes = torch.tensor([0x30, 0x34, 0x38, 0x3C, 0x40], dtype=torch.int8)
    records[..., record - 32:] = scale_bytes[torch.randint(0, 5, (n // 16, k // 32, 32))]
    return records.reshape(-1)


def packed_bases(params):
    s_channel = torch.rand(N) * 0.01 + 0.001
    base = dict(x=bf16(M, PACKED_K), qdata=packed_record(k=PACKED_K), s_rel=torch.ones(1), s_channel=s_channel,
                bias=bf16(N), out_dtype=torch.bfloat16)
    return [base, dict(base, x=torch.randn(2, M, K).half(), out_dtype=torch.float16, bias=None)]


def rope_freqs(positions, pairs, heads_axis=False):
    """ComfyUI's freqs_cis: one rotation matrix per position and pair, (1, 1, L, D/2, 2, 2)
    (BNSD) or (1, L, 1, D/2, 2, 2) (BSND)."""
    angle = torch.randn(positions, pairs)
    cos, sin = torch.cos(angle), torch.sin(angle)
    matrices = torch.stack([cos, -sin, sin, cos], dim=-1).reshape(positions, pairs, 2, 2)
    return matrices.reshape(1, positions, 1, pairs, 2, 2) if heads_axis else matrices.reshape(
        1, 1, positions, pairs, 2, 2)


def rope_bases(params):
    """Valid RoPE calls: BNSD bf16 with fp32 freqs_cis, BSND fp16, a freqs_cis longer than x
    (eager trims it), and for rms_rope_split_half a partial rotation (rot_dim)."""
    names = [n for n in ("x", "xq", "xk", "q", "k") if n in params]
    h, length, d = ROPE_H, ROPE_L, ROPE_D

    def call(shape, dtype, freqs, **extra):
        base = {n: torch.randn(*shape).to(dtype) for n in names}
        base["freqs_cis"] = freqs
        for scale in ("scale", "q_scale", "k_scale"):
            if scale in params:
                base[scale] = (torch.rand(shape[-1]) + 0.5).to(dtype)
        if "epsilon" in params:
            base["epsilon"] = 1e-6
        base.update({k: v for k, v in extra.items() if k in params})
        return base

    bases = [call((1, h, length, d), torch.bfloat16, rope_freqs(length, d // 2), rot_dim=0),
             call((1, length, h, d), torch.float16, rope_freqs(length, d // 2, heads_axis=True)),
             call((1, h, length, d), torch.bfloat16, rope_freqs(2 * length, d // 2))]
    if "rot_dim" in params:
        bases.append(call((1, h, length, d), torch.bfloat16, rope_freqs(length, d // 4), rot_dim=d // 2))
    return bases


ROPE_FUNCTIONS = [base + suffix for base in (
    "apply_rope", "apply_rope1", "apply_rope_split_half", "apply_rope_split_half1",
    "rms_rope", "rms_rope1", "rms_rope_split_half", "rms_rope_split_half1") for suffix in ("", "_")]

BASES = {
    **{f: rope_bases for f in ROPE_FUNCTIONS},
    "int8_linear": int8_bases,
    "int8_linear_modulated": modulated_bases,
    "int8_linear_rms_modulated": modulated_bases,
    "w4a8_int8_linear": w4a8_bases,
    "w4a8_packed_linear": packed_bases,
}


# -- the grid ---------------------------------------------------------------------

def grid(function, params):
    """(label, kwargs of CPU tensors, {param: transform or None for "stays on the CPU"})."""
    bases = [{k: v for k, v in b.items() if k in params} for b in BASES[function](params)]
    for index, base in enumerate(bases):
        yield "base%d" % index, base, {}
        varied = base if index == 0 else {k: v for k, v in base.items()
                                          if k not in bases[0] or bases[0][k] is not v}
        for name, value in varied.items():
            if isinstance(value, torch.Tensor):
                for label, transform in tensor_variants(value).items():
                    yield "base%d %s %s" % (index, name, label), base, {name: transform}
                if params[name].default is None:
                    yield "base%d %s absent" % (index, name), {k: v for k, v in base.items() if k != name}, {}
            for option in OPTIONS.get(name, ()):
                if option is not value and not isinstance(value, torch.Tensor):
                    yield "base%d %s=%r" % (index, name, option), dict(base, **{name: option}), {}


def place(kwargs, transforms, device):
    out = {}
    for name, value in kwargs.items():
        if isinstance(value, torch.Tensor):
            transform = transforms.get(name, lambda v: v)
            if name in transforms and transform is None:  # the device variant
                value, transform = value.clone(), (lambda v: v)
            else:
                value = value.to(device, copy=True)  # a copy: in-place functions change it
            value = transform(value)
        out[name] = value
    return out


def outcome(function, kwargs):
    try:
        result = getattr(ck, function)(**kwargs)
    except Exception as exc:
        return {"error": type(exc).__name__, "message": str(exc)[:300]}, None
    if isinstance(result, tuple) and result and all(isinstance(r, torch.Tensor) for r in result):
        # (q, k) of the RoPE family: compared as one flat tensor
        return {"dtype": ",".join(short(r.dtype) for r in result), "shape": [list(r.shape) for r in result],
                "device": result[0].device.type}, torch.cat([r.detach().cpu().double().reshape(-1) for r in result])
    if not isinstance(result, torch.Tensor):
        return {"error": "not a tensor: %s" % type(result).__name__}, None
    return {"dtype": short(result.dtype), "shape": list(result.shape),
            "device": result.device.type}, result.detach().cpu()


def distance(got, want):
    """max |got - want| / max |want| over finite values, and whether the non-finite ones agree."""
    g, w = got.double(), want.double()
    if g.shape != w.shape:
        return {"comparable": False}
    finite = torch.isfinite(w)
    same_nonfinite = bool(torch.equal(finite, torch.isfinite(g))
                          and torch.equal(torch.isnan(w), torch.isnan(g)))
    if not finite.any():
        return {"comparable": True, "same_nonfinite": same_nonfinite, "max_rel": 0.0, "max_abs": 0.0,
                "cos": 1.0}
    diff = (g[finite] - w[finite]).abs()
    scale = w[finite].abs().max().item()
    cos = torch.nn.functional.cosine_similarity(g[finite], w[finite], dim=0).item() if scale else 1.0
    return {"comparable": True, "same_nonfinite": same_nonfinite, "max_abs": diff.max().item(), "cos": cos,
            "max_rel": diff.max().item() / scale if scale else (0.0 if diff.max().item() == 0 else float("inf")),
            "ref_max": scale}


def registered_functions():
    backends = ck.registry.list_backends()
    return sorted({f for name in SHIM_BACKENDS if name in backends for f in backends[name]["capabilities"]})


def main():
    torch.manual_seed(0)
    functions = registered_functions()
    from importlib.metadata import version

    report = {"kitchen": version("comfy-kitchen"), "functions": functions, "missing_grid": [],
              "points": {}, "mismatches": []}
    for function in functions:
        if function not in BASES:
            report["missing_grid"].append(function)
            continue
        params = inspect.signature(getattr(ck, function)).parameters
        count, started = 0, time.perf_counter()
        for label, kwargs, transforms in grid(function, params):
            count += 1
            on_npu = place(kwargs, transforms, "npu")
            if None in transforms.values():
                # a tensor left on the CPU: no all-CPU call is the same; eager's own answer
                # to these very tensors is the reference
                with ck.registry.use_backend("eager"):
                    want, want_t = outcome(function, on_npu)
                if want_t is not None and want_t.device.type != "cpu":
                    want_t = want_t.cpu()
            else:
                want, want_t = outcome(function, place(kwargs, transforms, "cpu"))
            if function.endswith("_"):  # in place: the reference call changed on_npu
                on_npu = place(kwargs, transforms, "npu")
            got, got_t = outcome(function, on_npu)
            first = next(n for n in ("x", "xq", "q") if n in on_npu)
            got["x_device"] = on_npu[first].device.type
            record = {"function": function, "point": label, "eager_cpu": want, "npu": got}
            if want_t is not None and got_t is not None:
                record["distance"] = distance(got_t, want_t)
            if not agrees(want, got, record.get("distance")):
                report["mismatches"].append(record)
        report["points"][function] = count
        report.setdefault("function_seconds", {})[function] = round(time.perf_counter() - started, 2)
    report["seconds"] = time.perf_counter() - START  # since the first import, startup included
    print(json.dumps(report))


# results within this of eager (of eager's largest |value|), at this cosine; integer
# outputs also +-1. Eager quantizes activations per row, the float fallback does
# not: a row of 3 to 32 outputs differs by up to ~3% of its largest.
MAX_REL = 5e-2
MIN_COS = 0.999


def agrees(want, got, dist):
    if "error" in want or "error" in got:
        return want.get("error") == got.get("error")
    if want["dtype"] != got["dtype"] or want["shape"] != got["shape"] or got["device"] != got["x_device"]:
        return False
    if not dist["comparable"] or not dist["same_nonfinite"]:
        return False
    floating = all(d in ("float16", "bfloat16", "float32", "float64") for d in want["dtype"].split(","))
    if not floating:
        return dist["max_abs"] <= 1 or dist["max_rel"] <= MAX_REL
    return dist["max_rel"] <= MAX_REL and dist["cos"] >= MIN_COS


if __name__ == "__main__":
    sys.exit(main())
