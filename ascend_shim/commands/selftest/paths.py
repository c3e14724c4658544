"""The shim's further device paths, each through its production entry point.

* ``aten::_int_mm``: the shim's kernel (``aten/int_mm``) reached as users
  reach it, ``torch._int_mm`` on NPU tensors, bit-exact against the CPU's,
  with ``torch.npu.matmul.allow_hf32`` off and, as a user may leave it, on
  (an fp32 GEMM in HF32 is not exact, and the user's setting must survive);
* W4A8 (kitchen 0.2.27+): ``w4a8_int8_linear`` as registration binds it to
  the INT8 backend (``w4a8.bound_to``): int4 codes decoded to int8 on the
  device bit-exact, its quant calls, the layer against float64;
* ``torch.linalg.solve`` and ``lgamma`` as uni_pc and sa_solver call them: the shim's
  kernels (``aten/sampler_ops``) against float64 within their stated bounds;
* fp8: the host-side decode (``npu_math.fp8.decode``) of all 256 codes of
  each float8 format, exact against the value of its bit fields;
* the MiniMax-H3 video VAE decoder's q/k path (patch ``minimax_vae_fused``): one gather, one
  norm, one ``npu_rotary_mul`` over whole heads, scored as the attention sees q and k.

Each returns a list of check results, empty when this shim or kitchen lacks the path.
"""

import sys
from typing import Any, Callable

import torch

from ascend_shim.commands.selftest import cases, checks, reference
from ascend_shim.commands.selftest.int8_paths import has_convrot
from ascend_shim.commands.selftest.recording import describe, describe_call
from ascend_shim.kitchen.backend import Int8Backend


def int_mm_kernel() -> str:
    """Who serves ``aten::_int_mm`` on the NPU, registering the shim's kernel as its patch does."""
    from ascend_shim.aten import int_mm

    if not int_mm.registered() and int_mm.served_elsewhere() is None:
        int_mm.register()  # what the int_mm patch does when torch_npu loads
    return "ascend_shim" if int_mm.registered() else "torch_npu"


def int_mm_checks(device: torch.device, backend: Int8Backend) -> list[dict]:
    """``torch._int_mm`` on the device, bit-exact against CPU ``torch._int_mm``."""
    from ascend_shim.aten import int_mm

    served_by = int_mm_kernel()
    settings = getattr(torch.npu, "matmul", None)  # type: ignore[attr-defined]  # torch_npu's
    flags = (False, True) if hasattr(settings, "allow_hf32") else (None,)
    user = settings.allow_hf32 if settings is not None and flags[0] is not None else None
    results = []
    try:
        for seed, spec in enumerate(cases.INT_MM_CASES):
            a, b = cases.int_mm_operands(spec, seed)
            expected = torch._int_mm(a, b)
            for hf32 in flags:
                results.append(int_mm_case(spec[0], a, b, expected, device, settings, hf32, served_by))
        results.append(int_mm.paths_check(device, sys.modules.get("torch_npu")))  # both paths, bit for bit
    finally:
        if settings is not None and user is not None:
            settings.allow_hf32 = user
    return results


def int_mm_case(name: str, a: torch.Tensor, b: torch.Tensor, expected: torch.Tensor, device: torch.device,
                settings: Any, hf32: Any, served_by: str) -> dict:
    label = {None: "", False: ", HF32 off", True: ", HF32 on"}[hf32]
    result: dict[str, Any] = {"name": "aten::_int_mm %s%s" % (name, label), "served_by": served_by}
    a_dev, b_dev = a.to(device), b.to(device)
    arguments: dict[str, Any] = {"self": describe(a_dev), "mat2": describe(b_dev)}
    if hf32 is not None:
        settings.allow_hf32 = hf32
        arguments["torch.npu.matmul.allow_hf32"] = hf32
    failures = []
    try:
        out = torch._int_mm(a_dev, b_dev)
    except Exception as exc:
        failures.append("the call raised %s: %s" % (type(exc).__name__, exc))
    else:
        metrics, failures = checks.int_mm_check(out, expected, device)
        result.update(metrics)
    if hf32 is not None and settings.allow_hf32 != hf32:
        failures.append("torch.npu.matmul.allow_hf32 was %s before the call and %s after"
                        % (hf32, settings.allow_hf32))
    result.update(passed=not failures, failures=failures,
                  calls=[{"call": "torch._int_mm", "arguments": arguments}])
    return result


def w4a8_checks(device: torch.device, backend: Int8Backend) -> list[dict]:
    """The shim's W4A8 linear, bound to the INT8 backend as registration binds it."""
    try:
        import comfy_kitchen as ck

        from ascend_shim.kitchen import w4a8
    except ImportError:
        return []
    if not hasattr(ck, w4a8.LINEAR) or not has_convrot(backend):
        return []
    linear = w4a8.bound_to(backend).linear
    ops = backend.ops
    results = []
    for seed, spec in enumerate(cases.W4A8_CASES):
        codes, kw = cases.w4a8_inputs(spec, device, seed)
        ops.calls = []
        result: dict[str, Any] = {"name": spec[0], "path": "w4a8"}
        try:
            out = linear(group_size=cases.W4A8_GROUP, convrot_groupsize=spec[4],
                         out_dtype=getattr(torch, spec[5]), **kw)
        except Exception as exc:
            failures = ["the call raised %s: %s" % (type(exc).__name__, exc)]
        else:
            metrics, failures = w4a8_check(out, codes, kw, spec, ops.calls)
            result.update(metrics)
        result.update(passed=not failures, failures=failures, calls=[describe_call(c) for c in ops.calls])
        results.append(result)
    return results


def w4a8_check(out: torch.Tensor, codes: torch.Tensor, kw: dict, spec: tuple, calls: list) -> checks.Checked:
    weight = reference.w4a8_weight(codes, kw["s_rel"], kw["codebook"], cases.W4A8_GROUP)
    failures = checks.output_failures(out, kw["x"], weight.shape[0], getattr(torch, spec[5]))
    if failures:
        return {}, failures
    metrics, failures = checks.device_call_checks(calls)
    matmuls = [c for c in calls if c.op == "npu_quant_matmul" and c.result is not None]
    if matmuls:
        decoded = matmuls[-1].args[1].t().detach().to("cpu")
        metrics["decode_mismatches"] = int((decoded != weight).sum().item())
        if metrics["decode_mismatches"]:
            failures.append("%d of %d decoded int8 weights differ from the codes' levels * s_rel"
                            % (metrics["decode_mismatches"], weight.numel()))
    e2e, e2e_failures = checks.end_to_end(out, reference.float_linear(kw["x"], weight, kw["s_channel"],
                                                                       kw["bias"], spec[4]))
    metrics.update(e2e)
    return metrics, failures + e2e_failures


def fp8_checks(device: torch.device, backend: Int8Backend) -> list[dict]:
    """Every float8 code decoded by the shim: exact in bf16, scaled within one rounding."""
    from ascend_shim.npu_math import fp8 as fp8_math

    results = []
    for name, exponent_bits, mantissa_bits, finite_only in cases.FP8_FORMATS:
        dtype = getattr(torch, name, None)
        if dtype is None:
            continue
        bits = torch.arange(256, dtype=torch.int32).to(torch.uint8).reshape(16, 16)
        expected = reference.fp8_value(bits, exponent_bits, mantissa_bits, finite_only)
        result: dict[str, Any] = {"name": "fp8 decode %s, all 256 codes" % name, "path": "fp8 (host)"}
        try:
            plain = fp8_math.decode(bits.view(dtype)).to(device)
            scale = torch.rand(16, 1, generator=torch.Generator().manual_seed(7)) + 0.5
            scaled = fp8_math.decode(bits.view(dtype), scale).to(device)
        except Exception as exc:
            failures = ["the decode raised %s: %s" % (type(exc).__name__, exc)]
        else:
            metrics, failures = checks.fp8_decode_check(plain, scaled, expected, scale)
            result.update(metrics)
        result.update(passed=not failures, failures=failures,
                      calls=[{"call": "ascend_shim.npu_math.fp8.decode",
                              "arguments": {"weight": "all 256 %s codes as [16, 16]" % name,
                                            "scale": "None, then float32 [16, 1]"}}])
        results.append(result)
    return results


def sampler_ops_checks(device: torch.device, backend: Int8Backend) -> list[dict]:
    """``torch.linalg.solve`` and ``lgamma`` as uni_pc / sa_solver call them (kernels registered as the patch does)."""
    from ascend_shim.aten import sampler_ops

    if not sampler_ops.REGISTRATION.registered() and sampler_ops.REGISTRATION.served_elsewhere() is None:
        sampler_ops.REGISTRATION.install()  # what the sampler_ops patch does when torch_npu loads
    return [sampler_ops.device_check(device)]


DECODER_QK = "MiniMax-H3 VAE decoder q/k: gather, norm, rotary over whole heads"
# the decoder's attention: 32 heads of 64, 48 channels rotated; fp16 as ComfyUI decodes it
DECODER_HEADS, DECODER_HEAD, DECODER_ROT, DECODER_TOKENS, DECODER_EPS = 32, 64, 48, 130, 1e-5
# q and k rows are RMS-normed (|value| about 1); two fp16 roundings each put a score of 64 terms
# within about 0.03 of float64; a pair rotated with the wrong partner is off by 1 or more
DECODER_SCORE_MAX_ERR = 2.0 ** -3


def decoder_qk_checks(device: torch.device, backend: Int8Backend) -> list[dict]:
    """The ``minimax_vae_fused`` patch's q/k path (``vit_blocks.normed_rotated_qk``) on the device,
    through the norm ComfyUI calls (``F.rms_norm``) and ``npu_rotary_mul``: the attention scores it
    gives against ComfyUI's definition in float64 (scores: the channel order is the path's own)."""
    rotary = getattr(sys.modules.get("torch_npu"), "npu_rotary_mul", None)
    if rotary is None:
        return []
    from ascend_shim.npu_math import rope, vit_blocks

    heads, d, rot, tokens = DECODER_HEADS, DECODER_HEAD, DECODER_ROT, DECODER_TOKENS
    generator = torch.Generator().manual_seed(11)
    qkv = (torch.randn(tokens, heads * 3 * d, generator=generator) * 3).half()
    angle = torch.rand(tokens, rot // 2, generator=generator, dtype=torch.float64) * 6.3
    table = torch.stack((angle.cos(), -angle.sin(), angle.sin(), angle.cos()), -1).reshape(tokens, rot // 2, 2, 2).half()
    result: dict[str, Any] = {"name": DECODER_QK, "path": "minimax_vae_fused"}
    failures = []
    try:
        table_dev = table.reshape(1, tokens, 1, rot // 2, 2, 2).to(device)
        r1, r2 = rope.rotary_coefficients(table_dev, split_half=True, width=d)
        index = vit_blocks.qk_order(heads, d, rot).to(device)

        def norm(t: torch.Tensor) -> torch.Tensor:
            return torch.nn.functional.rms_norm(t, (d,), None, DECODER_EPS)

        q, k = vit_blocks.normed_rotated_qk(qkv.unsqueeze(0).to(device), index, d, norm, rotary, r1, r2)
    except Exception as exc:
        failures.append("the path raised %s: %s" % (type(exc).__name__, exc))
    else:
        scores = torch.einsum("shc,thc->hst", reference.f64(q[0]), reference.f64(k[0]))
        want = reference.decoder_qk_scores(qkv, table, heads, d, DECODER_EPS)
        err = float((scores - want).abs().max())
        result.update(score_max_err=err, score_max=float(want.abs().max()))
        if not err <= DECODER_SCORE_MAX_ERR:  # NaN fails too
            failures.append("attention scores off by %.4g (at most %.4g expected)" % (err, DECODER_SCORE_MAX_ERR))
    result.update(passed=not failures, failures=failures,
                  calls=[{"call": "ascend_shim.npu_math.vit_blocks.normed_rotated_qk",
                          "arguments": {"qkv": "float16 [1, %d, %d]" % (tokens, heads * 3 * d), "dim_head": d,
                                        "rotated": rot, "rotary": "torch_npu.npu_rotary_mul",
                                        "norm": "torch.nn.functional.rms_norm"}}])
    return [result]


# each returns the results of one more device path; empty when this shim lacks it
EXTRA_CHECKS: tuple[Callable[[torch.device, Int8Backend], list[dict]], ...] = (
    int_mm_checks, w4a8_checks, fp8_checks, sampler_ops_checks, decoder_qk_checks)

