"""The pure INT8 functions, on CPU tensors (no device needed)."""

import pytest
import torch

from ascend_shim.npu_math import int8 as int8_math


def test_exact_int_mm_matches_int64_reference_beyond_fp32_precision():
    torch.manual_seed(1)
    # K = 5000 with extreme values: |acc| reaches 5000*128*128 > 2**24, so a single
    # fp32 GEMM would round; the chunked one must not
    a = torch.full((3, 5000), -128, dtype=torch.int8)
    b = torch.full((5000, 2), -128, dtype=torch.int8)
    a[1] = torch.randint(-128, 128, (5000,), dtype=torch.int8)
    exact = (a.long() @ b.long())
    out = int8_math.exact_int_mm(a, b)
    assert out.dtype == torch.int32
    assert torch.equal(out.long(), exact)
    assert abs(exact).max() > 2 ** 24


def test_exact_int_mm_random_shapes():
    torch.manual_seed(2)
    for m, k, n in ((1, 1, 1), (7, 1023, 5), (4, 1024, 9), (5, 3001, 3)):
        a = torch.randint(-128, 128, (m, k), dtype=torch.int8)
        b = torch.randint(-128, 128, (k, n), dtype=torch.int8)
        assert torch.equal(int8_math.exact_int_mm(a, b).long(), a.long() @ b.long())


@pytest.mark.parametrize("shape", [(), (1,), (64,), (64, 1)])
def test_flat_weight_scale(shape):
    scale = torch.rand(shape, dtype=torch.bfloat16)
    flat = int8_math.flat_weight_scale(scale)
    assert flat.dim() == 1 and flat.dtype == torch.float32
    assert flat.numel() == max(1, scale.numel())
    assert torch.equal(flat, scale.float().reshape(-1))


def test_dequantized_linear_matches_float_math():
    torch.manual_seed(3)
    q = torch.randint(-127, 128, (16, 32), dtype=torch.int8)
    scale = torch.rand(16, 1)
    x = torch.randn(2, 5, 32)
    bias = torch.randn(16)
    out = int8_math.dequantized_linear(x, q, scale, bias, torch.float32)
    expected = x @ (q.float() * scale).t() + bias
    assert torch.allclose(out, expected, atol=1e-5)
    scalar = int8_math.dequantized_linear(x, q, torch.tensor(0.5), None, torch.bfloat16)
    assert scalar.dtype == torch.bfloat16
    assert torch.allclose(scalar.float(), x @ (q.float() * 0.5).t(), rtol=1e-2, atol=1e-1)


FLOATS = (torch.float16, torch.bfloat16, torch.float32)


@pytest.mark.parametrize("x_dtype", FLOATS)
@pytest.mark.parametrize("out_dtype", FLOATS)
@pytest.mark.parametrize("scale,x_magnitude", [(1000.0, 1e-3), (1e-7, 1e4)])
def test_dequantized_linear_survives_extreme_scales(x_dtype, out_dtype, scale, x_magnitude):
    """Outputs of about 1-1000, representable in every dtype, from weight scales whose
    dequantized weight (127 * 1000) overflows fp16 or (127 * 1e-7) underflows it."""
    torch.manual_seed(4)
    q = torch.randint(-127, 128, (64, 128), dtype=torch.int8)
    q[:, 0] = 127
    weight_scale = torch.full((64, 1), scale)
    x = (torch.randn(9, 128) * x_magnitude).to(x_dtype)
    bias = torch.randn(64)
    expected = x.double() @ (q.double() * scale).t() + bias.double()
    out = int8_math.dequantized_linear(x, q, weight_scale, bias, out_dtype)
    assert out.dtype == out_dtype
    assert torch.isfinite(out).all()
    error = (out.double() - expected).abs().mean() / expected.abs().mean()
    assert error <= 5e-3, error


def test_flat_bias_is_eagers_reshape():
    bias = torch.arange(6.0).reshape(1, 1, 6)
    flat = int8_math.flat_bias(bias, torch.bfloat16)
    assert flat.shape == (6,) and flat.dtype == torch.bfloat16
    assert torch.equal(flat.float(), torch.arange(6.0))
    same = torch.ones(6, dtype=torch.float16)
    assert int8_math.flat_bias(same, torch.float16) is same


def test_apply_residual_keeps_the_output_dtype():
    out = torch.ones(2, 4, dtype=torch.bfloat16)
    residual = torch.full((2, 4), 3.0)
    scale = torch.full((4,), 2.0)
    result = int8_math.apply_residual(out, residual, scale)
    assert result.dtype == torch.bfloat16 and torch.equal(result.float(), torch.full((2, 4), 5.0))
    assert int8_math.apply_residual(out, None, None) is out
    with pytest.raises(ValueError, match="residual requires residual_scale"):
        int8_math.apply_residual(out, residual, None)


def test_modulate():
    x = torch.ones(2, 3, 4)
    scale = torch.tensor([0.0, 1.0, 2.0, -1.0])
    assert torch.equal(int8_math.modulate(x, scale)[1, 2], torch.tensor([1.0, 2.0, 3.0, 0.0]))
    with pytest.raises(ValueError, match="one batch-one row of 4 values"):
        int8_math.modulate(x, torch.ones(8))


def test_npu_quant_linear_passes_the_scales_once_and_the_weight_as_a_view():
    """What reaches the ops: recorded by a stand-in with the documented signatures."""
    calls = {}

    class Ops:
        def npu_dynamic_quant(self, x):
            calls["dq"] = x
            return torch.zeros(x.shape, dtype=torch.int8), torch.ones(x.shape[0])

        def npu_quant_matmul(self, x1, x2, scale, *, pertoken_scale=None, bias=None, output_dtype=None):
            calls["qmm"] = dict(x1=x1, x2=x2, scale=scale, pertoken_scale=pertoken_scale, bias=bias,
                                output_dtype=output_dtype)
            return torch.zeros(x1.shape[0], x2.shape[1], dtype=output_dtype)

    weight = torch.randint(-127, 128, (8, 16), dtype=torch.int8)
    x = torch.randn(4, 16, dtype=torch.bfloat16)
    # a bias of N elements in any shape goes in as [N] (eager: bias.reshape(1, -1))
    out = int8_math.npu_quant_linear(x, weight, torch.rand(8, 1), torch.randn(1, 1, 8), torch.bfloat16,
                                     Ops())
    qmm = calls["qmm"]
    assert qmm["x2"].data_ptr() == weight.data_ptr() and qmm["x2"].shape == (16, 8)  # .t() view
    assert qmm["scale"].shape == (8,) and qmm["scale"].dtype == torch.float32
    assert qmm["pertoken_scale"].shape == (4,)
    assert qmm["bias"].dtype == torch.bfloat16 and qmm["bias"].shape == (8,)
    assert qmm["output_dtype"] == torch.bfloat16
    assert out.shape == (4, 8)


@pytest.mark.parametrize("value,expected", [(4, True), (16, True), (64, True), (256, True), (8, False),
                                            (2, False), (1, False), (0, False), (True, False), (128, False)])
def test_is_power_of_four(value, expected):
    assert int8_math.is_power_of_four(value) is expected
