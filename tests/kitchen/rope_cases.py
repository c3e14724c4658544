"""RoPE cases on the simulated NPU, for one real comfy-kitchen release.

Run in a fresh interpreter on the test bed (``ASCEND_TESTBED=ascend-cu130``,
the kitchen release on PYTHONPATH, the shim installed). Prints one JSON
object; ``test_rope.py`` asserts.

    python rope_cases.py [numerics|cache|declined|registration|wrong_op]
"""

import gc
import inspect
import json
import sys

import torch
import torch_npu  # noqa: F401  (registers the npu device, as on a real box)

SUITE = sys.argv[1] if len(sys.argv) > 1 else "numerics"
if SUITE == "wrong_op":  # an npu_rotary_mul that swaps its modes, installed before kitchen loads
    _real = torch_npu.npu_rotary_mul

    def _swapped(input, r1, r2, rotary_mode="half", rotate=None):
        return _real(input, r1, r2, "interleave" if rotary_mode == "half" else "half", rotate)

    torch_npu.npu_rotary_mul = _swapped

if SUITE == "registration":
    # the fake's ops served through the real wheel's schemas (torch.ops packets, as torch_npu
    # exposes them): upstream's ascend reads the schema before it registers its RoPE
    import harness
    from testbed import torch_ops_packets

    _library = torch_ops_packets.serve_from_file(
        torch_npu, harness.torch_npu_dir("2.12.0") / "registered_schemas.txt")

import comfy_kitchen as ck  # noqa: E402
from comfy_kitchen.registry import registry  # noqa: E402
from testbed import npu_device  # noqa: E402

NPU = torch.device("npu", 0)
torch.manual_seed(0)
EPS = {torch.bfloat16: 2.0 ** -8, torch.float16: 2.0 ** -11, torch.float32: 2.0 ** -24}


def freqs_cis(positions, pairs, heads_axis=False, batch=1):
    angle = torch.rand(batch, positions, pairs) * 100
    cos, sin = torch.cos(angle), torch.sin(angle)
    m = torch.stack([cos, -sin, sin, cos], dim=-1).reshape(batch, positions, pairs, 2, 2)
    return m.unsqueeze(2) if heads_axis else m.unsqueeze(1)


def shim_report():
    from ascend_shim.kitchen import rope

    return rope.report()


def flat(result):
    return torch.cat([r.detach().cpu().double().reshape(-1) for r in (
        result if isinstance(result, tuple) else (result,))])


def compare(got, want, dtype):
    """max |got - want| in units of the output dtype's rounding of |want| (half an ulp = 1),
    floored at the rounding of the largest value's fp32 terms (2^-24 of max |want|)."""
    g, w = flat(got), flat(want)
    unit = EPS[dtype] * w.abs() + 2.0 ** -24 * w.abs().max()
    cos = torch.nn.functional.cosine_similarity(g, w, dim=0).item()
    return {"max_abs": (g - w).abs().max().item(), "max_units": ((g - w).abs() / unit).max().item(),
            "equal_fraction": (g == w).double().mean().item(), "cos": cos}


def model_calls(dtype):
    """(name, function, kwargs on CPU) at model shapes."""
    d = 128
    flux = dict(xq=torch.randn(1, 24, 1024, d).to(dtype), xk=torch.randn(1, 24, 1024, d).to(dtype),
                freqs_cis=freqs_cis(1024, d // 2))
    lumina = dict(q=torch.randn(1, 1024, 24, d).to(dtype), k=torch.randn(1, 1024, 8, d).to(dtype),
                  freqs_cis=freqs_cis(1024, d // 2, heads_axis=True),
                  q_scale=(torch.rand(d) + 0.5).to(dtype), k_scale=(torch.rand(d) + 0.5).to(dtype))
    minimax = dict(q=torch.randn(1, 16, 1024, d).to(dtype), k=torch.randn(1, 16, 1024, d).to(dtype),
                   freqs_cis=freqs_cis(1024, d // 4), q_scale=(torch.rand(d) + 0.5).to(dtype), rot_dim=d // 2)
    calls = [("flux apply_rope", "apply_rope", flux),
             ("flux apply_rope1", "apply_rope1", dict(x=flux["xq"], freqs_cis=flux["freqs_cis"])),
             ("ltx apply_rope_split_half", "apply_rope_split_half", flux),
             ("lumina rms_rope", "rms_rope", lumina),
             ("lumina rms_rope1", "rms_rope1", dict(x=lumina["q"], freqs_cis=lumina["freqs_cis"],
                                                    scale=lumina["q_scale"])),
             ("minimax rms_rope_split_half rot_dim", "rms_rope_split_half", minimax),
             ("rms_rope_split_half1", "rms_rope_split_half1",
              dict(x=flux["xq"], freqs_cis=flux["freqs_cis"], scale=minimax["q_scale"])),
             ("apply_rope_split_half1 trimmed-less", "apply_rope_split_half1",
              dict(x=flux["xq"], freqs_cis=flux["freqs_cis"]))]
    if "trim_rope_freqs" in dir(sys.modules.get("comfy_kitchen.backends.eager.rope")):
        calls.append(("apply_rope1 longer freqs (trimmed)", "apply_rope1",
                      dict(x=flux["xq"][:, :, :1000], freqs_cis=flux["freqs_cis"])))
    # a release without a function, or without one of its options (rot_dim: 0.2.2x), has no such call
    return [(n, f, a) for n, f, a in calls
            if hasattr(ck, f) and set(a) <= set(inspect.signature(getattr(ck, f)).parameters)]


def on_npu(kwargs):
    return {k: v.to(NPU) if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()}


def numerics():
    from ascend_shim.kitchen import rope

    cases = []
    for dtype in (torch.bfloat16, torch.float16):
        for name, function, kwargs in model_calls(dtype):
            for inplace in (False, True):
                fn = function + ("_" if inplace else "")
                if not hasattr(ck, fn):
                    continue
                want = getattr(ck, fn)(**{k: v.clone() if isinstance(v, torch.Tensor) else v
                                          for k, v in kwargs.items()})
                torch_npu._testbed.reset()
                npu_device.reset_cpu_fallbacks()
                before = dict(rope.COUNTERS.fused)
                got = getattr(ck, fn)(**on_npu(kwargs))
                outs = got if isinstance(got, tuple) else (got,)
                cases.append({"name": "%s %s%s" % (name, str(dtype)[6:], " in place" if inplace else ""),
                              "dtype": str(dtype)[6:], **compare(got, want, dtype),
                              "devices": sorted({o.device.type for o in outs}),
                              "fused": rope.COUNTERS.fused[fn] - before.get(fn, 0),
                              "rotary_mul": torch_npu._testbed.calls["npu_rotary_mul"],
                              "rms_norm": torch_npu._testbed.calls["npu_rms_norm"],
                              "cpu_fallbacks": sorted(npu_device.cpu_fallbacks())})
    return {"cases": cases}


def cache():
    from ascend_shim.kitchen import rope

    x = torch.randn(1, 4, 16, 64).to(torch.bfloat16)
    f = freqs_cis(16, 32)
    fn = f.to(NPU)
    xn = x.to(NPU)
    out = {}
    rope.COUNTERS.reset()
    rope.CACHE.clear()
    for _ in range(10):
        ck.apply_rope1(xn, fn)
        ck.apply_rope_split_half1(xn, fn)
    out["ten_calls"] = dict(built=rope.COUNTERS.coefficients_built, reused=rope.COUNTERS.coefficients_reused,
                            entries=len(rope.CACHE))
    # changed in place: rebuilt, the answer is eager's on the new values
    fn.mul_(-1)
    f.mul_(-1)
    got = ck.apply_rope1(xn, fn).cpu()
    out["changed_in_place"] = dict(built=rope.COUNTERS.coefficients_built,
                                   **compare(got, ck.apply_rope1(x, f), torch.bfloat16))
    # freed: its entries go; a new tensor (perhaps at the same address) is never served stale
    entries = len(rope.CACHE)
    del fn
    gc.collect()
    out["freed"] = dict(entries_before=entries, entries_after=len(rope.CACHE))
    wrong = 0
    for _ in range(5):
        f2 = freqs_cis(16, 32)
        got = ck.apply_rope1(xn, f2.to(NPU)).cpu()
        wrong += compare(got, ck.apply_rope1(x, f2), torch.bfloat16)["max_units"] > 2
    out["new_tensors_wrong"] = wrong
    # inference tensors keep no version counter: used, never cached
    with torch.inference_mode():
        fi = f.to(NPU)
        entries = len(rope.CACHE)
        built = rope.COUNTERS.coefficients_built
        got = ck.apply_rope1(xn, fi).cpu()
        fi.mul_(-1)
        got2 = ck.apply_rope1(xn, fi).cpu()
        out["inference"] = dict(entries_added=len(rope.CACHE) - entries,
                                built=rope.COUNTERS.coefficients_built - built,
                                first=compare(got, ck.apply_rope1(x, f), torch.bfloat16)["max_units"],
                                after_change=compare(got2, ck.apply_rope1(x, -f), torch.bfloat16)["max_units"])
    out["in_place_pair"] = in_place_pair()
    out["build_ops"] = build_ops()
    out["refused_in_place"] = refused_in_place()
    return out


def minimax_qk(dtype=torch.bfloat16, s=64, heads=4, d=64):
    """MiniMax-H3's call: q and k are views into one qkv buffer, half of each head rotated."""
    qkv = torch.randn(s, 3 * heads * d).to(dtype)
    q, k, _ = qkv.split(heads * d, dim=-1)
    return qkv, dict(q=q.view(1, s, heads, d), k=k.view(1, s, heads, d), freqs_cis=freqs_cis(s, d // 4, heads_axis=True),
                     q_scale=(torch.rand(d) + 0.5).to(dtype), k_scale=(torch.rand(d) + 0.5).to(dtype), rot_dim=d // 2)


def in_place_pair():
    """Under inference_mode, as a prompt runs: one coefficient build for q and k, the results
    written straight into the qkv buffer."""
    from ascend_shim.kitchen import rope

    qkv, kwargs = minimax_qk()
    want = qkv.clone()
    q, k, _ = want.split(kwargs["q"].shape[-1] * kwargs["q"].shape[-2], dim=-1)
    ck.rms_rope_split_half_(**dict(kwargs, q=q.view(kwargs["q"].shape), k=k.view(kwargs["k"].shape)))
    with torch.inference_mode():
        qkv_npu = qkv.to(NPU)
        q, k, _ = qkv_npu.split(kwargs["q"].shape[-1] * kwargs["q"].shape[-2], dim=-1)
        call = on_npu(dict(kwargs, q=q.view(kwargs["q"].shape), k=k.view(kwargs["k"].shape)))
        built = rope.COUNTERS.coefficients_built
        npu_device.reset_op_counts(enable=True)
        try:
            ck.rms_rope_split_half_(**call)
        finally:
            ops = dict(npu_device.op_counts())
            npu_device.reset_op_counts(enable=False)
        return dict(built=rope.COUNTERS.coefficients_built - built, ops=ops,
                    **compare(qkv_npu.cpu(), want, torch.bfloat16))


def build_ops():
    """The device ops one coefficient build runs, each layout (after the first, which may set up)."""
    from ascend_shim.kitchen import rope

    rope.CACHE._build(freqs_cis(16, 8).to(NPU), False)
    out = {}
    for split in (False, True):
        f = freqs_cis(16, 8).to(NPU)
        npu_device.reset_op_counts(enable=True)
        try:
            rope.CACHE._build(f, split)
        finally:
            ops = dict(npu_device.op_counts())
            npu_device.reset_op_counts(enable=False)
        out["split" if split else "interleave"] = ops
    return out


def refused_in_place():
    """npu_rotary_mul refuses after npu_rms_norm ran: eager serves the call from untouched inputs."""
    from ascend_shim.kitchen import rope

    qkv, kwargs = minimax_qk()
    want = qkv.clone()
    q, k, _ = want.split(kwargs["q"].shape[-1] * kwargs["q"].shape[-2], dim=-1)
    ck.rms_rope_split_half_(**dict(kwargs, q=q.view(kwargs["q"].shape), k=k.view(kwargs["k"].shape)))
    real = torch_npu.npu_rotary_mul

    def refusing(*args, **kw):
        raise RuntimeError("EZ1001: the simulated op refuses this call")

    qkv_npu = qkv.to(NPU)
    q, k, _ = qkv_npu.split(kwargs["q"].shape[-1] * kwargs["q"].shape[-2], dim=-1)
    call = on_npu(dict(kwargs, q=q.view(kwargs["q"].shape), k=k.view(kwargs["k"].shape)))
    before = dict(rope.COUNTERS.to_eager)
    torch_npu.npu_rotary_mul = refusing
    try:
        ck.rms_rope_split_half_(**call)
    finally:
        torch_npu.npu_rotary_mul = real
    to_eager = rope.COUNTERS.to_eager["rms_rope_split_half_"] - before.get("rms_rope_split_half_", 0)
    return dict(to_eager=to_eager, **compare(qkv_npu.cpu(), want, torch.bfloat16))


def declined():
    """Calls outside the ops' limits: eager serves them on the device."""
    from ascend_shim.kitchen import rope

    calls = {
        "interleave B*N >= 1000": ("apply_rope1", dict(x=torch.randn(2, 500, 4, 16).to(torch.bfloat16),
                                                        freqs_cis=freqs_cis(4, 8))),
        "D >= 896": ("apply_rope_split_half1", dict(x=torch.randn(1, 2, 4, 896).to(torch.bfloat16),
                                                      freqs_cis=freqs_cis(4, 448))),
        "fp32 scale, bf16 x": ("rms_rope1", dict(x=torch.randn(1, 2, 4, 16).to(torch.bfloat16),
                                                 freqs_cis=freqs_cis(4, 8), scale=torch.rand(16) + 0.5)),
        "3-D x": ("apply_rope1", dict(x=torch.randn(2, 4, 16), freqs_cis=freqs_cis(4, 8)[0])),
    }
    cases = []
    for name, (function, kwargs) in calls.items():
        if not hasattr(ck, function):
            continue
        rope.COUNTERS.reset()
        npu_device.reset_cpu_fallbacks()
        torch_npu._testbed.reset()
        want = getattr(ck, function)(**kwargs)
        got = getattr(ck, function)(**on_npu(kwargs))
        cases.append({"name": name, "device": got.device.type, "cpu_fallbacks": sorted(npu_device.cpu_fallbacks()),
                      "fused": sum(rope.COUNTERS.fused.values()), "declined": sum(rope.COUNTERS.declined.values()),
                      "to_eager": sum(rope.COUNTERS.to_eager.values()),
                      "rotary_mul": torch_npu._testbed.calls["npu_rotary_mul"],
                      **compare(got, want, got.dtype)})
    return {"cases": cases}


def registration():
    x = torch.randn(1, 2, 4, 16).to(torch.bfloat16).to(NPU)
    f = freqs_cis(4, 8).to(NPU)
    serving = {}
    for function, kwargs in (("apply_rope1", dict(x=x, freqs_cis=f)),
                             ("apply_rope1", dict(x=x.float(), freqs_cis=f))):
        if hasattr(ck, function):
            serving["%s %s" % (function, str(kwargs["x"].dtype)[6:])] = registry.get_capable_backend(
                function, kwargs)
    return {"priority": list(registry._priority), "serving": serving}


def wrong_op():
    from ascend_shim.kitchen import rope

    x = torch.randn(1, 2, 4, 16).to(torch.bfloat16)
    f = freqs_cis(4, 8)
    got = ck.apply_rope_split_half1(x.to(NPU), f.to(NPU)).cpu()
    return {"report": rope.report(), **compare(got, ck.apply_rope_split_half1(x, f), torch.bfloat16)}


SUITES = {"numerics": numerics, "cache": cache, "declined": declined, "registration": registration,
          "wrong_op": wrong_op}

if __name__ == "__main__":
    from importlib.metadata import version

    result = SUITES[SUITE]()
    result.update(kitchen=version("comfy-kitchen"), report=result.get("report") or shim_report())
    print(json.dumps(result, default=str))
