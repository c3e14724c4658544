"""``lgamma`` from ops torch_npu registers (``log``, ``log1p``, ``sin``, ``round``, ``floor``, ``where``...).

torch_npu 2.12.0 registers no ``lgamma`` kernel (nor ``lgamma.out``), so
``Tensor.lgamma()`` on the NPU runs on the CPU. This is ``log|Gamma(x)|`` in
float32 or float64, with the CPU's values at the special points:

* ``x >= 10``: Stirling's series, ``x (log x - 1) - log(x) / 2 + log(2 pi) / 2``
  plus seven Bernoulli terms (the first omitted term is below 3e-17 at 10);
  ``x (log x - 1)`` rather than ``(x - 1/2) log x - x`` so that a finite
  result never overflows on the way.
* ``0.5 <= x < 10``: the Taylor series of ``lgamma(2 + e)`` at ``|e| <= 1/2``,
  whose coefficients are ``(-1)^k (zeta(k) - 1) / k`` (computed here from
  Euler-Maclaurin sums), after ``lgamma(x) = log((x-1)...(x-m)) + lgamma(x-m)``
  downwards or ``lgamma(x) = lgamma(x+1) - log1p(x-1)`` near 1. Each shift is an
  exact subtraction, so ``lgamma(1) = lgamma(2) = 0`` exactly and at the
  integers the result is the logarithm of an exact factorial.
* ``x < 0.5``: the reflection ``log(pi) - log|sin(pi r)| - lgamma(1 - x)``
  with ``r = x - round(x)`` exact, ``+inf`` at the poles (non-positive
  integers), as the CPU gives; ``+inf`` at ``+-inf``; NaN stays NaN.

Pure tensor code; imports nothing of the shim.
"""

from __future__ import annotations

import math
from fractions import Fraction
from typing import List

import torch

# Bernoulli numbers B2, B4, ..., B14
_BERNOULLI = (Fraction(1, 6), Fraction(-1, 30), Fraction(1, 42), Fraction(-1, 30), Fraction(5, 66),
              Fraction(-691, 2730), Fraction(7, 6))
STIRLING_FROM = 10.0
SHIFTS = 8  # at most 8 downward steps bring [2.5, 10) into [1.5, 2.5)
TERMS = {torch.float64: 28, torch.float32: 13}  # (1/4)^k below each dtype's rounding
SMALL_R = {torch.float64: 1e-8, torch.float32: 1e-4}  # (pi r)^2 / 6 below each dtype's rounding


def _zeta_minus_one(k: int, n: int = 20) -> float:
    """``zeta(k) - 1`` for k >= 2: a direct sum to ``n - 1`` and the Euler-Maclaurin tail."""
    total = sum(m ** -k for m in range(2, n))
    total += n ** (1 - k) / (k - 1) + 0.5 * n ** -k
    rising = float(k)  # k (k+1) ... (k + 2j - 2)
    factorial = 2.0  # (2j)!
    for j, bernoulli in enumerate(_BERNOULLI, start=1):
        total += float(bernoulli) / factorial * rising * n ** (-k - 2 * j + 1)
        rising *= (k + 2 * j - 1) * (k + 2 * j)
        factorial *= (2 * j + 1) * (2 * j + 2)
    return total


EULER_GAMMA = 0.5772156649015329
# lgamma(2 + e) = sum_k TAYLOR_2[k-1] e^k
TAYLOR_2: List[float] = [1.0 - EULER_GAMMA] + [(-1) ** k * _zeta_minus_one(k) / k for k in range(2, 29)]
# lgamma(x) = Stirling + sum_j STIRLING[j-1] / x^(2j-1)
STIRLING: List[float] = [float(b / (2 * j * (2 * j - 1))) for j, b in enumerate(_BERNOULLI, start=1)]
HALF_LOG_TWO_PI = 0.5 * math.log(2 * math.pi)
LOG_PI = math.log(math.pi)


def _near_two(e: torch.Tensor, terms: int) -> torch.Tensor:
    """``lgamma(2 + e)`` for ``|e| <= 1/2`` (Horner)."""
    acc = torch.full_like(e, TAYLOR_2[terms - 1])
    for coefficient in reversed(TAYLOR_2[:terms - 1]):
        acc = acc * e + coefficient
    return acc * e


def _positive(w: torch.Tensor, terms: int) -> torch.Tensor:
    """``lgamma(w)`` for ``w >= 0.5`` (and +inf, NaN passed through as garbage for the caller)."""
    big = w >= STIRLING_FROM
    low = w < 1.5
    steps = torch.clamp(torch.floor(w - 1.5), 0, SHIFTS)
    e = torch.where(low, w - 1, (w - steps) - 2)  # exact subtractions
    e = torch.where(big, torch.zeros_like(e), e)
    product = torch.ones_like(w)
    for i in range(1, SHIFTS + 1):
        product = product * torch.where(steps >= i, w - i, torch.ones_like(w))
    middle = _near_two(e, terms) + torch.where(low, -torch.log1p(e), torch.log(product))
    x = torch.where(big, w, torch.full_like(w, STIRLING_FROM))
    r2 = 1 / (x * x)
    series = torch.full_like(x, STIRLING[-1])
    for coefficient in reversed(STIRLING[:-1]):
        series = series * r2 + coefficient
    log_x = torch.log(x)
    stirling = x * (log_x - 1) - 0.5 * log_x + HALF_LOG_TWO_PI + series / x
    return torch.where(big, stirling, middle)


def lgamma(x: torch.Tensor) -> torch.Tensor:
    """``log|Gamma(x)|`` of a float32 or float64 tensor, in its dtype."""
    terms = TERMS.get(x.dtype, TERMS[torch.float32])
    reflect = x < 0.5
    w = torch.where(reflect, 1 - x, x)
    value = _positive(w, terms)
    r = x - torch.round(x)
    # log|sin(pi r)|; near the poles log(pi) + log|r| (sin(pi r) / (pi r) = 1 to the dtype's
    # rounding), where ``pi * r`` would round a subnormal r
    tiny = torch.abs(r) < SMALL_R.get(x.dtype, SMALL_R[torch.float32])
    log_sin = torch.where(tiny, LOG_PI + torch.log(torch.abs(r)), torch.log(torch.abs(torch.sin(math.pi * r))))
    reflected = LOG_PI - log_sin - value
    out = torch.where(reflect, reflected, value)
    inf = torch.full_like(x, math.inf)
    out = torch.where((reflect & (r == 0)) | (torch.abs(x) == math.inf), inf, out)
    return torch.where(torch.isnan(x), x, out)
