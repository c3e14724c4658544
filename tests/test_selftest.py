"""``python -m ascend_shim selftest`` catches a device that is wrong about any call the shim makes.

Each corruption of the simulated device (``TESTBED_QMM_CORRUPT``, see the
fake torch_npu's ``_ops.CORRUPTIONS``; the float fallback, ConvRot's
rotation, HF32, the W4A8 unpack and the host's fp8 conversion are corrupted
in the scenario) gets a fresh interpreter running the
selftest; it must exit 1 and name the case that exposes it. The clean bed
must pass. The checkers' rounding bounds are tested in-process.
"""

import json

import pytest
import torch

import harness
from ascend_shim.commands.selftest import cases, checks, recording, reference
from ascend_shim.commands.selftest import paths as device_paths

KITCHEN = "0.2.40"

M1 = "M=1, bf16 out, no bias, scale [N,1]"
ODD_BF16 = "odd M, bf16 out, bf16 bias, scale ()"
ODD_FP16 = "odd M, fp16 out, fp16 bias, scale [N]"
FP16_NO_BIAS = "fp16 out, no bias, scale [N,1]"
BF16_TO_FP16 = "bf16 x, fp16 out, bf16 bias (passed as fp16)"
TILE = "M=1030 past the 128- to 1024-row tiles, bf16 bias"
K104 = "K=104 N=40 (off the 16-grid), bf16 bias"
K97 = "K=97 N=45 (odd), fp16 bias"
BATCH_SLICE = "3-D x batch slice (storage offset), fp16 bias"
BATCH_3D = "3-D x [2,19,K], bf16 bias"
COLUMN_SLICE = "2-D x column slice (row stride > K), bf16 bias"
ZERO_ROW = "all-zero activation row, bf16 bias"
CONVROT = ("ConvRot group 16, bf16 bias", "ConvRot group 256, fp16 bias")
FALLBACK = ("fallback: dequantized linear, bf16 bias", "fallback: dequantized linear, fp16, fp16 bias, scale ()")
LAYER = "int8_linear M=64 K=3840 N=3840"
# uint8 x int8 always takes the kernel's fp32 K-chunks (int8 x int8 takes the INT8 cube where exact)
INT_MM = "aten::_int_mm uint8 x int8 M=9 K=600 N=24, mat2 a .t() view, %s"
INT_MM_PATHS = "_int_mm kernel paths on the device: INT8 cube vs fp32 K-chunks, bit for bit"
W4A8 = tuple(case[0] for case in cases.W4A8_CASES)
FP8 = ("fp8 decode float8_e4m3fn, all 256 codes", "fp8 decode float8_e5m2, all 256 codes")

# corruption of the device -> cases that must fail because of it
DEVICE_CORRUPTIONS = {
    "pertoken_dropped": {LAYER, M1, ODD_BF16},
    "scale_twice": {LAYER, M1, ODD_FP16},
    "x2_strides_ignored": {LAYER, M1, ODD_BF16},
    "bias_ignored": {ODD_BF16, ODD_FP16, *CONVROT},
    "fp16_zeros": {ODD_FP16, FP16_NO_BIAS, BF16_TO_FP16},
    "bf16_bias_as_fp16": {ODD_BF16, TILE, K104},
    "fp16_bias_as_bf16": {ODD_FP16, BF16_TO_FP16, K97},
    "per_channel_scale_first": {M1, ODD_FP16, FP16_NO_BIAS},
    "odd_m_tail": {ODD_BF16, ODD_FP16, K97},
    "m_tile": {TILE},
    "k_tail": {K104, K97},
    "n_tail": {K104, K97},
    "dyn_round_toward_zero": {LAYER, M1, ODD_BF16},
    "dyn_strides_ignored": {COLUMN_SLICE},
    "dyn_offset_ignored": {BATCH_SLICE},
    "zero_row_nan": {ZERO_ROW},
}

RUN_SELFTEST = """
from ascend_shim.commands import main as cli
sys.exit(cli.main(["selftest", "--json"]))
"""
# the device's float GEMM (the fallback's F.linear) leaves out the last 16 columns of K
FALLBACK_GEMM_K_TILE_DROPPED = """
import sys, torch
real_linear = torch.nn.functional.linear
def linear(input, weight, bias=None):
    if input.device.type == "npu":
        return real_linear(input[..., :-16], weight[:, :-16], bias)
    return real_linear(input, weight, bias)
torch.nn.functional.linear = linear
""" + RUN_SELFTEST
# the device's batched matmul (ConvRot's rotation) returns its left operand
BATCHED_MATMUL_IDENTITY = """
import sys, torch
real_matmul = torch.matmul
def matmul(a, b, **kwargs):
    if a.device.type == "npu" and a.dim() == 3:
        return a.clone()
    return real_matmul(a, b, **kwargs)
torch.matmul = matmul
""" + RUN_SELFTEST
# the device runs fp32 GEMMs in HF32 whatever torch.npu.matmul.allow_hf32 says
HF32_STUCK_ON = """
import sys
from testbed import npu_device
real_set = npu_device.set_matmul_allow_hf32
npu_device.set_matmul_allow_hf32 = lambda enabled: real_set(True)
""" + RUN_SELFTEST
# the _int_mm kernel leaves the user's HF32 on for its GEMMs
INT_MM_WITHOUT_HF32_GUARD = """
import sys, contextlib
from ascend_shim.npu_math import int8 as int8_math
int8_math.hf32_off = contextlib.nullcontext
""" + RUN_SELFTEST
# the device's right shift of int32 loses the top bit of the high nibble (W4A8 unpack)
RIGHT_SHIFT_LOSES_BIT_3 = """
import sys
from testbed import npu_device
real_dispatch = npu_device._dispatch
def dispatch(func, args, kwargs):
    out = real_dispatch(func, args, kwargs)
    return out & 7 if "rshift" in func.name() else out
npu_device._dispatch = dispatch
""" + RUN_SELFTEST
# the host's float8_e4m3fn conversion flushes subnormals to zero
FP8_SUBNORMALS_FLUSHED = """
import sys, torch
real_to = torch.Tensor.to
def to(self, *args, **kwargs):
    out = real_to(self, *args, **kwargs)
    if self.dtype == torch.float8_e4m3fn and out.dtype != self.dtype:
        subnormal = (self.view(torch.uint8) & 0x78) == 0
        out = torch.where(subnormal, torch.zeros_like(out), out)
    return out
torch.Tensor.to = to
""" + RUN_SELFTEST
SCENARIO_CORRUPTIONS = {
    "right_shift_loses_bit_3": (RIGHT_SHIFT_LOSES_BIT_3, set(W4A8)),
    "fp8_subnormals_flushed": (FP8_SUBNORMALS_FLUSHED, {FP8[0]}),
    "hf32_stuck_on": (HF32_STUCK_ON, {INT_MM % "HF32 off", INT_MM % "HF32 on", INT_MM_PATHS}),
    "int_mm_without_hf32_guard": (INT_MM_WITHOUT_HF32_GUARD, {INT_MM % "HF32 on", INT_MM_PATHS}),
    "fallback_gemm_k_tile_dropped": (FALLBACK_GEMM_K_TILE_DROPPED, set(FALLBACK)),
    "convrot_matmul_identity": (BATCHED_MATMUL_IDENTITY, set(CONVROT)),
}


# bugs in the product itself, not in the device: selftest runs the product's backends, so it
# sees them (a selftest that repeated the backend's steps itself would pass them)
BACKEND_SKIPS_CONVROT = """
import sys
from ascend_shim.kitchen import backend
backend.Int8Backend.rotate = lambda self, x, group: x
""" + RUN_SELFTEST
BACKEND_SCRAMBLES_3D_ROWS = """
import sys
from ascend_shim.kitchen import backend
real_quant = backend.Int8Backend._quant
def quant(self, call):
    out = real_quant(self, call)
    return out if out.dim() == 2 else out.reshape(-1, out.shape[-1]).flip(0).reshape(out.shape)
backend.Int8Backend._quant = quant
""" + RUN_SELFTEST
# the decoder's q/k path gathering each head's channels in ComfyUI's order: the whole-head rotary
# then pairs (i, i + 32) where ComfyUI rotates (i, i + 24)
DECODER_GATHERS_COMFYUI_ORDER = """
import sys
from ascend_shim.npu_math import vit_blocks
vit_blocks.head_order = lambda dim_head, rot: list(range(dim_head))
""" + RUN_SELFTEST
PRODUCT_BUGS = {
    "backend_skips_convrot": (BACKEND_SKIPS_CONVROT, {*CONVROT, *W4A8}),
    "backend_scrambles_3d_rows": (BACKEND_SCRAMBLES_3D_ROWS, {BATCH_3D, BATCH_SLICE}),
}


def run_selftest(python, tmp_path, kitchen=KITCHEN, code=None, json_output=True, **env):
    args = [str(python)] + (["-c", code] if code else
                            ["-m", "ascend_shim", "selftest"] + (["--json"] if json_output else []))
    return harness.run(args, harness.bed_env("ascend-cu130", kitchen=kitchen, **env), tmp_path, timeout=600)


def report(proc):
    try:
        return json.loads(proc.stdout)
    except ValueError:
        raise AssertionError("selftest printed no JSON (exit %d)\nstdout:\n%s\nstderr:\n%s"
                             % (proc.returncode, proc.stdout, proc.stderr)) from None


def failed_checks(result):
    return {c["name"]: c for c in result["checks"] if not c["passed"]}


def assert_caught(proc, expected):
    result = report(proc)
    failed = failed_checks(result)
    assert proc.returncode == 1 and result["passed"] is False, sorted(failed)
    missing = expected - set(failed)
    assert not missing, "not caught by %s (failed: %s)" % (sorted(missing), sorted(failed))
    return failed


# --------------------------------------------------------------------------- on the simulated device


def test_the_clean_device_passes_every_case(bed_python, tmp_path):
    proc = run_selftest(bed_python, tmp_path)
    result = report(proc)
    assert proc.returncode == 0 and result["passed"] is True, sorted(failed_checks(result))
    by_name = {c["name"]: c for c in result["checks"]}
    for case in cases.matrix():
        check = by_name[case.name]
        assert check["passed"] and "skipped" not in check, check
        if case.path == "npu":
            # each recorded device call was checked against float64
            assert 0 < check["qmm_max_err_ratio"] <= 1 and check["codes_max_diff"] <= 1
            assert check["cosine"] >= checks.COSINE_MIN and check["rel_mae"] <= checks.REL_MAE_MAX
            assert [c["call"] for c in check["calls"]] == ["torch_npu.npu_dynamic_quant",
                                                           "torch_npu.npu_quant_matmul"]
        else:
            assert 0 < check["gemm_max_err_ratio"] <= 1
    int_mm = [c for c in result["checks"] if c["name"].startswith("aten::_int_mm")]
    assert len(int_mm) == 2 * len(cases.INT_MM_CASES)
    assert all(c["served_by"] == "ascend_shim" and c["mismatches"] == 0 for c in int_mm)
    paths = by_name[INT_MM_PATHS]
    assert paths["passed"] and paths["report"]["fp32_chunks"]["exact"], paths
    assert paths["report"]["quant_matmul_int32"]["same_as_fp32_chunks"] is True, paths
    for name in W4A8:
        assert by_name[name]["passed"] and by_name[name]["decode_mismatches"] == 0
        assert by_name[name]["cosine"] >= checks.COSINE_MIN and by_name[name]["qmm_max_err_ratio"] <= 1
    for name in FP8:
        assert by_name[name]["passed"] and by_name[name]["mismatches"] == 0
    # the decoder's q/k path: the attention scores of float64 within the fp16 roundings
    decoder = by_name[device_paths.DECODER_QK]
    assert decoder["passed"] and 0 < decoder["score_max_err"] <= device_paths.DECODER_SCORE_MAX_ERR, decoder
    print("decoder q/k scores: max error %.4g of %.4g" % (decoder["score_max_err"], decoder["score_max"]))
    versions = result["versions"]
    assert versions["cann"] == "9.1.0-beta.1" and versions["torch_npu"] == "2.12.0"
    assert versions["comfy_kitchen"] == KITCHEN and versions["torch"] == torch.__version__


def test_without_comfy_kitchen_convrot_is_skipped_and_the_rest_passes(bed_python, tmp_path):
    proc = run_selftest(bed_python, tmp_path, kitchen=None)
    result = report(proc)
    assert proc.returncode == 0 and result["passed"] is True, sorted(failed_checks(result))
    by_name = {c["name"]: c for c in result["checks"]}
    for name in CONVROT:
        assert "comfy-kitchen is not installed" in by_name[name]["skipped"]
    assert "skipped" not in by_name[ODD_FP16] and result["versions"]["comfy_kitchen"] is None
    # kitchen's dispatch is a row of its own, and the report says plainly what was not checked
    assert by_name["comfy-kitchen int8_linear"]["skipped"] == cases.KITCHEN_ABSENT
    assert result["not_checked"] == {cases.KITCHEN_ABSENT: [*CONVROT, "comfy-kitchen int8_linear"]}
    text = run_selftest(bed_python, tmp_path, kitchen=None, json_output=False)
    assert text.returncode == 0
    assert ("NOT checked: %s; %s; comfy-kitchen int8_linear (comfy-kitchen is not installed in this python): "
            "comfy-kitchen's dispatch of int8_linear to the shim and its ConvRot rotation were not tested; "
            "install it in this venv and run selftest again" % CONVROT) in " ".join(text.stdout.split())


@pytest.mark.parametrize("corruption", sorted(DEVICE_CORRUPTIONS))
def test_a_corrupted_quant_op_fails_the_selftest(bed_python, tmp_path, corruption):
    proc = run_selftest(bed_python, tmp_path, TESTBED_QMM_CORRUPT=corruption)
    failed = assert_caught(proc, DEVICE_CORRUPTIONS[corruption])
    for name in DEVICE_CORRUPTIONS[corruption]:
        # the report names the device calls of the failing case, arguments and all
        calls = {c["call"]: c["arguments"] for c in failed[name]["calls"]}
        matmul = calls["torch_npu.npu_quant_matmul"]
        assert set(matmul) >= {"x1", "x2", "scale", "pertoken_scale", "bias", "output_dtype"}
        assert matmul["x1"]["dtype"] == "torch.int8" and "stride" in matmul["x2"]


@pytest.mark.parametrize("corruption", sorted(SCENARIO_CORRUPTIONS))
def test_a_corrupted_float_op_fails_the_selftest(bed_python, tmp_path, corruption):
    code, expected = SCENARIO_CORRUPTIONS[corruption]
    assert_caught(run_selftest(bed_python, tmp_path, code=code), expected)


@pytest.mark.parametrize("bug", sorted(PRODUCT_BUGS))
def test_a_bug_in_the_product_backend_fails_the_selftest(bed_python, tmp_path, bug):
    code, expected = PRODUCT_BUGS[bug]
    failed = assert_caught(run_selftest(bed_python, tmp_path, code=code), expected)
    # the device is right: each of its recorded calls passes, the product's result does not
    for name in expected:
        assert not any(f.startswith("npu_") or "torch_npu." in f for f in failed[name]["failures"]), failed[name]
        assert any("against the float64 layer" in f for f in failed[name]["failures"]), failed[name]


def test_the_decoder_qk_path_in_comfyuis_channel_order_fails_the_selftest(bed_python, tmp_path):
    failed = assert_caught(run_selftest(bed_python, tmp_path, code=DECODER_GATHERS_COMFYUI_ORDER),
                           {device_paths.DECODER_QK})
    check = failed[device_paths.DECODER_QK]
    assert check["score_max_err"] > 1, check  # a wrong partner, not a rounding
    assert check["failures"][0].startswith("attention scores off by "), check
    assert check["calls"][0]["call"] == "ascend_shim.npu_math.vit_blocks.normed_rotated_qk", check


def test_a_call_this_cann_refuses_is_reported_with_its_arguments(bed_python, tmp_path):
    code = """
import sys, torch, torch_npu
real = torch_npu.npu_quant_matmul
def refusing(*args, **kwargs):
    bias = kwargs.get("bias")
    if bias is not None and bias.dtype == torch.float16:
        raise RuntimeError("aclnnQuantMatmulV4: bias dtype float16 not supported, please upgrade CANN")
    return real(*args, **kwargs)
torch_npu.npu_quant_matmul = refusing
""" + RUN_SELFTEST
    failed = assert_caught(run_selftest(bed_python, tmp_path, code=code), {ODD_FP16, K97, BF16_TO_FP16})
    check = failed[ODD_FP16]
    assert check["failures"] == ["the call raised RuntimeError: aclnnQuantMatmulV4: bias dtype float16 not "
                                 "supported, please upgrade CANN"]
    matmul = check["calls"][-1]
    assert matmul["call"] == "torch_npu.npu_quant_matmul"
    assert matmul["arguments"]["bias"]["dtype"] == "torch.float16"
    assert matmul["arguments"]["output_dtype"] == "torch.float16"
    assert M1 not in failed and ODD_BF16 not in failed


def test_the_text_report_can_be_pasted_upstream(bed_python, tmp_path):
    proc = run_selftest(bed_python, tmp_path, json_output=False, TESTBED_QMM_CORRUPT="bias_ignored")
    out = proc.stdout
    assert proc.returncode == 1, out + proc.stderr
    assert out.startswith("selftest on Ascend910B3: torch %s, torch_npu 2.12.0, CANN 9.1.0-beta.1"
                          % torch.__version__)
    block = out[out.index("[FAIL] %s" % ODD_BF16):]
    assert "npu_quant_matmul off by" in block
    assert ("torch_npu.npu_quant_matmul(x1=Tensor[37, 80] torch.int8 stride=(80, 1) offset=0 npu:0, "
            "x2=Tensor[80, 56] torch.int8 stride=(1, 80) offset=0 npu:0, "
            "scale=Tensor[1] torch.float32 stride=(1,) offset=0 npu:0, "
            "pertoken_scale=Tensor[37] torch.float32 stride=(1,) offset=0 npu:0, "
            "bias=Tensor[56] torch.bfloat16 stride=(1,) offset=0 npu:0, "
            "output_dtype=torch.bfloat16)") in block
    assert "[PASS] %s" % M1 in out  # no bias: the defect does not touch it
    assert "paste this whole output" in " ".join(out.split())
    # every line but the failing calls' own (pasted whole) fits in 100 columns
    calls = [line for line in out.splitlines() if line.startswith("      torch_npu.")]
    assert all(len(line) <= 100 for line in out.splitlines() if line not in calls)


# --------------------------------------------------------------------------- the bounds, in-process


def quant_matmul_call(out_dtype=torch.bfloat16, seed=0):
    g = torch.Generator().manual_seed(seed)
    m, k, n = 9, 40, 24
    x1 = torch.randint(-127, 128, (m, k), generator=g, dtype=torch.int8)
    weight = torch.randint(-127, 128, (n, k), generator=g, dtype=torch.int8)
    scale = torch.rand(n, generator=g) * 0.01 + 0.001
    pertoken = torch.rand(m, generator=g) * 0.02 + 0.001
    bias = (torch.rand(n, generator=g) + 0.5).to(out_dtype)
    exact = (x1.double() @ weight.double().t()) * scale.double() * pertoken.double().unsqueeze(-1)
    out = (exact + bias.double()).to(out_dtype)  # one round-to-nearest-even, as the op
    kwargs = dict(pertoken_scale=pertoken, bias=bias, output_dtype=out_dtype)
    return recording.Call("npu_quant_matmul", (x1, weight.t(), scale), kwargs, out)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_quant_matmul_bound_passes_one_rounding_and_fails_three_ulps(dtype):
    call = quant_matmul_call(dtype)
    metrics, failures = checks.quant_matmul_check(call)
    assert failures == [] and 0 < metrics["qmm_max_err_ratio"] <= 0.5

    off = call.result.clone()
    off.view(torch.int16)[4, 7] += 3  # three representable values away from zero
    metrics, failures = checks.quant_matmul_check(recording.Call(call.op, call.args, call.kwargs, off))
    assert metrics["qmm_max_err_ratio"] > 1 and "worst at row 4 column 7" in failures[0]


def test_quant_matmul_bound_fails_a_dropped_bias():
    call = quant_matmul_call()
    without = dict(call.kwargs, bias=None)
    metrics, failures = checks.quant_matmul_check(recording.Call(call.op, call.args, without, call.result))
    assert failures and metrics["qmm_max_err_ratio"] > 100


def test_dynamic_quant_check_allows_one_code_and_catches_truncation():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(16, 96, generator=g).to(torch.bfloat16)
    xf = x.double()
    amax = xf.abs().amax(-1, keepdim=True)
    codes = torch.round(xf * 127 / amax).to(torch.int8)
    scale = (amax / 127).squeeze(-1).float()
    nudged = codes.clone()
    nudged[3, 5] += 1 if nudged[3, 5] < 127 else -1
    metrics, failures = checks.dynamic_quant_check(recording.Call("npu_dynamic_quant", (x,), {}, (nudged, scale)))
    assert failures == [] and metrics["codes_max_diff"] == 1

    truncated = torch.trunc(xf * 127 / amax).to(torch.int8)
    _, failures = checks.dynamic_quant_check(recording.Call("npu_dynamic_quant", (x,), {}, (truncated, scale)))
    assert any("off by one" in f for f in failures)


def test_the_reference_rotation_is_an_orthonormal_regular_hadamard():
    # equality with comfy-kitchen's own rotation shows on the bed: the ConvRot
    # cases of the clean run pass end to end against this reference
    for size in (4, 16, 256):
        h = reference.hadamard(size)
        assert torch.allclose(h @ h.t(), torch.eye(size, dtype=torch.float64))
        assert torch.equal(h.abs(), torch.full((size, size), size ** -0.5, dtype=torch.float64))
        assert torch.allclose(h.sum(dim=0), torch.ones(size, dtype=torch.float64))  # regular


@pytest.mark.parametrize("name, exponent_bits, mantissa_bits, finite_only", cases.FP8_FORMATS)
def test_the_fp8_reference_is_torchs_conversion(name, exponent_bits, mantissa_bits, finite_only):
    bits = torch.arange(256, dtype=torch.int32).to(torch.uint8)
    ours = reference.fp8_value(bits, exponent_bits, mantissa_bits, finite_only)
    theirs = bits.view(getattr(torch, name)).to(torch.float64)
    assert torch.equal(ours.isnan(), theirs.isnan())
    assert torch.equal(ours[~ours.isnan()], theirs[~theirs.isnan()])
