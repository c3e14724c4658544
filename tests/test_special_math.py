"""``ascend_shim.npu_math.special.lgamma``: the NPU kernel's arithmetic, on CPU tensors.

Stated bounds against float64 (``x.double().lgamma()``), tested here:

* ``x > 0``: relative error at most 8 units of the dtype's rounding
  (float32: ``8 * 2**-24``, about 4.8e-7; float64: ``8 * 2**-53``);
* ``x < 0``: absolute error at most ``64 u * max(1, |lgamma(x)|)`` (the
  reflection through ``1 - x`` rounds; near lgamma's zeros a relative bound would not hold);
* the integers 1..9 (sa_solver's ``lgamma(p + 1)``, orders up to 6), the poles, 0, -0.0, +-inf
  and NaN: exactly the CPU's values.
"""

import math

import pytest
import torch

from ascend_shim.npu_math import special

U = {torch.float32: 2.0 ** -24, torch.float64: 2.0 ** -53}


def grid(sign):
    values = torch.cat([torch.linspace(1e-6, 40, 200001, dtype=torch.float64),
                        torch.logspace(-30, 30, 4001, dtype=torch.float64)])
    return sign * values


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_positive_arguments_within_the_stated_relative_bound(dtype):
    x = grid(1).to(dtype)
    want = x.double().lgamma()
    got = special.lgamma(x).double()
    finite = torch.isfinite(x.lgamma()) & (want != 0)
    relative = ((got - want).abs() / want.abs())[finite]
    assert relative.max() <= 8 * U[dtype], (relative.max(), x[finite][relative.argmax()])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_negative_arguments_within_the_stated_absolute_bound(dtype):
    x = grid(-1).to(dtype)
    want = x.double().lgamma()
    got = special.lgamma(x).double()
    finite = torch.isfinite(x.lgamma())
    scaled = ((got - want).abs() / want.abs().clamp_min(1))[finite]
    assert scaled.max() <= 64 * U[dtype], (scaled.max(), x[finite][scaled.argmax()])
    assert torch.equal(torch.isfinite(got), torch.isfinite(x.lgamma()))  # the poles are the CPU's


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_sampler_arguments_are_the_cpus_bit_for_bit(dtype):
    p = torch.arange(9, dtype=dtype)  # compute_exponential_coeffs: (p + 1).lgamma(), orders up to 6
    assert torch.equal(special.lgamma(p + 1), (p + 1).lgamma())


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_special_points_like_the_cpu(dtype):
    x = torch.tensor([0.0, -0.0, -1.0, -2.0, -1e30, 1.0, 2.0, math.inf, -math.inf, math.nan, 1e-30, -1e-30,
                      0.5, -0.5, 2.5, 1e30], dtype=dtype)
    got, want = special.lgamma(x), x.lgamma()
    assert torch.equal(torch.isnan(got), torch.isnan(want))
    assert torch.equal(got[torch.isinf(want)], want[torch.isinf(want)])
    finite = torch.isfinite(want)
    torch.testing.assert_close(got[finite], want[finite], rtol=8 * U[dtype], atol=0)


def test_taylor_coefficients_are_zeta_minus_one():
    assert special._zeta_minus_one(2) == pytest.approx(math.pi ** 2 / 6 - 1, rel=1e-15)
    assert special._zeta_minus_one(4) == pytest.approx(math.pi ** 4 / 90 - 1, rel=1e-15)
    assert special.TAYLOR_2[0] == pytest.approx(1 - 0.5772156649015329, rel=1e-16)
