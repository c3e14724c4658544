"""ascend_shim.npu_math.fp8: host-side fp8 decoding, against float32 references.

The quality figures the README quotes come from ``test_quality_figures``
(run with ``-s`` to print them): cosine similarity of the decoded weight and
of a linear layer's output with the float32 reference built from the fp8
weights and scales, on Gaussian and heavy-tailed weights.
"""

import re
import types

import pytest

torch = pytest.importorskip("torch")

from ascend_shim.npu_math import fp8 as fp8_math  # noqa: E402
from ascend_shim.npu_math.fp8 import Fp8DecodeError  # noqa: E402

FP8 = (torch.float8_e4m3fn, torch.float8_e5m2)
FP8_MAX = {torch.float8_e4m3fn: 448.0, torch.float8_e5m2: 57344.0}


def gaussian(shape, generator):
    return torch.randn(shape, generator=generator) * 0.02


def laplace(shape, generator):
    u = torch.rand(shape, generator=generator) - 0.5
    return -torch.sign(u) * torch.log1p(-2 * u.abs()) * 0.02


def student_t3(shape, generator):
    normal = torch.randn(shape, generator=generator)
    chi2 = sum(torch.randn(shape, generator=generator) ** 2 for _ in range(3))
    return normal / torch.sqrt(chi2 / 3) * 0.02


DISTRIBUTIONS = {"gaussian": gaussian, "laplace": laplace, "student_t3": student_t3}


def fp8_weight(kind, dtype, shape=(512, 1024), seed=0, per_row=False):
    """(fp8 weight, scale, float32 reference) as a checkpoint stores them."""
    weight = DISTRIBUTIONS[kind](shape, torch.Generator().manual_seed(seed))
    amax = weight.abs().amax(dim=1, keepdim=True) if per_row else weight.abs().max()
    scale = (amax / FP8_MAX[dtype]).to(torch.float32)
    q = (weight / scale).to(dtype)
    return q, scale, q.to(torch.float32) * scale


def cosine(a, b):
    a, b = a.double().flatten(), b.double().flatten()
    return float(a @ b / (a.norm() * b.norm()))


def output_cosine(weight, reference, seed=1):
    x = torch.randn(64, reference.shape[1], generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    return cosine(x @ weight.double().T, x @ reference.double().T)


@pytest.mark.parametrize("dtype", FP8)
def test_decode_without_scale_is_exact_for_every_code(dtype):
    codes = torch.arange(256, dtype=torch.uint8).view(dtype)
    finite = torch.isfinite(codes.to(torch.float32))
    decoded = fp8_math.decode(codes[finite])
    assert decoded.dtype == torch.bfloat16
    assert torch.equal(decoded.to(torch.float32), codes[finite].to(torch.float32))


@pytest.mark.parametrize("dtype", FP8)
@pytest.mark.parametrize("per_row", [False, True])
@pytest.mark.parametrize("kind", sorted(DISTRIBUTIONS))
def test_bf16_decode_matches_the_fp32_reference(dtype, per_row, kind):
    q, scale, reference = fp8_weight(kind, dtype, per_row=per_row)
    decoded = fp8_math.decode(q, scale)
    assert decoded.shape == q.shape and decoded.dtype == torch.bfloat16
    # one bf16 rounding of the exact product: relative error <= 2**-9 per element
    assert torch.allclose(decoded.to(torch.float32), reference, rtol=2 ** -8, atol=0)
    assert cosine(decoded, reference) >= 0.9999
    assert output_cosine(decoded, reference) >= 0.9999


@pytest.mark.parametrize("dtype", FP8)
@pytest.mark.parametrize("kind", sorted(DISTRIBUTIONS))
def test_int8_requantization_reaches_0_999(dtype, kind):
    q, scale, reference = fp8_weight(kind, dtype)
    qdata, qscale = fp8_math.requantize_int8(q, scale)
    assert qdata.dtype == torch.int8 and qdata.shape == q.shape
    assert qscale.dtype == torch.float32 and qscale.shape == (q.shape[0], 1)
    assert int(qdata.abs().max()) <= 127
    dequantized = qdata.to(torch.float32) * qscale
    assert cosine(dequantized, reference) >= 0.999
    assert output_cosine(dequantized, reference) >= 0.999


def test_int8_rows_use_their_own_absolute_maximum():
    q = torch.tensor([[1.0, -2.0, 0.5], [0.0, 0.0, 0.0], [-448.0, 1.0, 2.0]]).to(torch.float8_e4m3fn)
    qdata, qscale = fp8_math.requantize_int8(q, torch.tensor(0.5))
    assert torch.equal(qscale.flatten(), torch.tensor([1.0 / 127, 1.0, 224.0 / 127]))
    assert qdata[0].tolist() == [64, -127, 32] and qdata[1].tolist() == [0, 0, 0]
    assert qdata[2, 0] == -127


def test_row_blocks_give_the_same_result(monkeypatch):
    q, scale, _ = fp8_weight("student_t3", torch.float8_e4m3fn, shape=(37, 50), per_row=True)
    whole = fp8_math.decode(q, scale), fp8_math.requantize_int8(q, scale)
    monkeypatch.setattr(fp8_math, "BLOCK_ELEMENTS", 120)  # two rows a block
    blocked = fp8_math.decode(q, scale), fp8_math.requantize_int8(q, scale)
    assert torch.equal(whole[0], blocked[0])
    assert torch.equal(whole[1][0], blocked[1][0]) and torch.equal(whole[1][1], blocked[1][1])


def test_group_scales_stored_as_bytes_decode_like_fp8():
    s_rel = (torch.rand(8, 16) * 2).to(torch.float8_e4m3fn)
    as_fp8 = fp8_math.decode_group_scales(s_rel)
    as_bytes = fp8_math.decode_group_scales(s_rel.view(torch.uint8))
    assert as_fp8.dtype == torch.float32 and torch.equal(as_fp8, s_rel.to(torch.float32))
    assert torch.equal(as_bytes, as_fp8)


@pytest.mark.parametrize("scale, message", [
    (torch.ones(3), "fits neither one value per tensor nor one per row (4 rows)"),
    (torch.tensor(float("inf")), "inf or nan"),
    (torch.tensor([1.0, float("nan"), 1.0, 1.0]), "inf or nan"),
    (torch.tensor(2, dtype=torch.int32), "must be a float tensor, got torch.int32"),
])
def test_a_scale_that_does_not_fit_is_refused(scale, message):
    q = torch.ones(4, 4).to(torch.float8_e4m3fn)
    for convert in (fp8_math.decode, fp8_math.requantize_int8):
        with pytest.raises(Fp8DecodeError, match="blocks.3 scale: .*" + re.escape(message)):
            convert(q, scale, what="blocks.3")


def test_an_8bit_float_this_torch_cannot_convert_is_refused(monkeypatch):
    monkeypatch.setattr(fp8_math, "FLOAT8_NAMES", ("float8_e4m3fn",))
    q = torch.ones(2, 2).to(torch.float8_e5m2)
    with pytest.raises(Fp8DecodeError, match="blocks.0: torch.float8_e5m2 is an 8-bit float this torch cannot convert"):
        fp8_math.decode(q, what="blocks.0")
    with pytest.raises(Fp8DecodeError, match="torch.float8_e5m2"):
        fp8_math.requantize_int8(q, what="blocks.0")
    assert fp8_math.decode(torch.ones(2, 2).to(torch.float8_e4m3fn)).dtype == torch.bfloat16


def test_quality_figures():
    """Prints the table the README quotes (weight / output cosine vs the fp32 reference)."""
    rows = []
    for kind in sorted(DISTRIBUTIONS):
        for dtype in FP8:
            q, scale, reference = fp8_weight(kind, dtype, shape=(1024, 1024))
            bf16 = fp8_math.decode(q, scale)
            qdata, qscale = fp8_math.requantize_int8(q, scale)
            int8 = qdata.to(torch.float32) * qscale
            rows.append((kind, str(dtype).replace("torch.", ""), cosine(bf16, reference),
                         output_cosine(bf16, reference), cosine(int8, reference), output_cosine(int8, reference)))
    print("\n| weights | fp8 | bf16 weight cos | bf16 output cos | int8 weight cos | int8 output cos |")
    for row in rows:
        print("| %s | %s | %.6f | %.6f | %.6f | %.6f |" % row)
    assert all(r[2] >= 0.9999 and r[3] >= 0.9999 and r[4] >= 0.999 and r[5] >= 0.999 for r in rows)


def test_one_8bit_float_test_for_the_math_and_the_patches():
    from ascend_shim.patches.comfyui.fp8 import dtypes as fp8_dtypes
    from ascend_shim.patches.comfyui.fp8 import layer as fp8_layer

    dtypes = [getattr(torch, n) for n in dir(torch) if isinstance(getattr(torch, n), torch.dtype)]
    for value in dtypes + [None, "float8_e4m3fn", 1]:
        expected = isinstance(value, torch.dtype) and value.is_floating_point and value.itemsize == 1
        assert fp8_math.is_8bit_float(value) is expected, value
        assert fp8_dtypes.is_8bit_float(value) is expected, value
        weight = types.SimpleNamespace(dtype=value)  # what the layer check reads of a tensor
        assert fp8_layer.may_hold_float8({"l.weight": weight}, "l.") is expected, value
