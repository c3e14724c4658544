"""Batched LU solve from elementwise, index and reduction ops (what torch_npu registers).

torch_npu 2.12.0 has no kernel for ``aten::_linalg_solve_ex`` (``torch.linalg.solve``)
nor for ``linalg_lu_factor_ex`` / ``linalg_lu_solve``; it does register ``abs``,
``amax``, ``amin``, ``eq``, ``where``, ``gather``, ``div``, ``mul``, ``sub``,
``isnan``. This module is Gaussian elimination with partial pivoting written in
those, with LAPACK's conventions so its outputs mean what the CPU's mean:

* ``lu_factor``: ``getrf``: packed ``L\\U`` (unit lower L), 1-based sequential row
  swaps ``pivots``, ``info`` = the first column whose pivot is exactly zero (the
  elimination goes on, as LAPACK's does); the pivot is the first entry of largest
  magnitude (``|re| + |im|`` for complex, LAPACK's ``i?amax``), or the first NaN
  (then the rest is NaN, as the CPU's is).
* ``lu_solve``: ``getrs``: row swaps, unit-lower then upper substitution, or the
  adjoint system; a zero pivot divides by zero and gives inf/NaN, as on the CPU.
* ``solve_ex``: what CPU ``_linalg_solve_ex`` returns (torch 2.12 and 2.13): the LU
  of A, NumPy's vector right-hand side, ``left=False`` through the adjoint
  system, batch dims broadcast.

Every step is a masked whole-matrix update (``where``), so a masked-out inf or
NaN never leaks into another entry. Cost: ``n`` steps of about fifteen small ops
for the factor, ``n`` of two or three per substitution: meant for the small
systems samplers build (uni_pc: 2x2 and 3x3; sa_solver: up to 6x6), correct for
any size. Pure tensor code; imports nothing of the shim.
"""

from __future__ import annotations

from typing import Tuple

import torch


def is_vector_rhs(A: torch.Tensor, B: torch.Tensor) -> bool:
    """NumPy's rule ``linalg.solve`` uses: B is a (batch of) vector(s)."""
    return B.dim() == 1 or (A.dim() - 1 == B.dim() and tuple(B.shape) == tuple(A.shape[:-1]))


def _magnitude(x: torch.Tensor) -> torch.Tensor:
    """LAPACK's pivot magnitude: ``|x|``, or ``|re| + |im|`` for complex."""
    if x.is_complex():
        return x.real.abs() + x.imag.abs()
    return x.abs()


class _Steps:
    """Each elimination step's masks, made once per call: taking step j's is a view, not a kernel.

    ``[j, i]`` / ``[j, i, k]`` index step j, row i, column k.
    """

    def __init__(self, n: int, device: torch.device) -> None:
        rows = torch.arange(n, device=device)
        self.n, self.rows = n, rows
        self.none = torch.full_like(rows, n)
        self.candidate = rows[None, :] >= rows[:, None]  # i >= j
        below = rows[None, :] > rows[:, None]  # i > j
        diagonal = rows[None, :] == rows[:, None]
        self.below, self.at = below[:, :, None], diagonal[:, :, None]
        self.above = (rows[None, :] < rows[:, None])[:, :, None]
        self.column = below[:, :, None] & diagonal[:, None, :]  # i > j, k == j
        self.trailing = below[:, :, None] & below[:, None, :]  # i > j, k > j


def _swap_rows(M: torch.Tensor, j: int, p: torch.Tensor, steps: _Steps) -> torch.Tensor:
    """Rows ``j`` and ``p`` (one index per batch matrix, shape ``M.shape[:-2]``) exchanged."""
    width = M.shape[-1]
    index = p[..., None, None].expand(*p.shape, 1, width)
    row_p = torch.gather(M, -2, index)
    row_j = M[..., j:j + 1, :]
    at_p = steps.rows[:, None] == p[..., None, None]
    return torch.where(at_p, row_j, torch.where(steps.at[j], row_p, M))


def _pivot_rows(mag: torch.Tensor, j: int, steps: _Steps, below_all: torch.Tensor) -> torch.Tensor:
    """Per matrix, the row (``>= j``) of the first NaN, else the first of largest magnitude.

    A NaN pivot makes the rest NaN, as the CPU's (OpenBLAS) elimination does; the
    first index among ties, whatever the backend's argmax does with them.
    """
    candidate, rows, none = steps.candidate[j], steps.rows, steps.none
    nan = torch.isnan(mag)
    first_nan = torch.amin(torch.where(candidate & nan, rows, none), dim=-1)
    mag = torch.where(candidate & ~nan, mag, below_all)
    best = torch.amax(mag, dim=-1, keepdim=True)
    first_max = torch.amin(torch.where(candidate & (mag == best), rows, none), dim=-1)
    return torch.where(first_nan < steps.n, first_nan, first_max)


def _first_zero(zero: list, steps: _Steps) -> torch.Tensor:
    """``info``: the 1-based step of the first exactly-zero pivot per matrix, else 0."""
    flags = torch.stack(zero, dim=-1)
    first = torch.amin(torch.where(flags, steps.rows + 1, steps.none + 1), dim=-1)
    return torch.where(first > steps.n, torch.zeros_like(first), first).to(torch.int32)


def lu_factor(A: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(LU, pivots, info)`` of square ``A`` (``..., n, n``), as LAPACK ``getrf`` returns them.

    ``pivots`` int32 (``..., n``), 1-based; ``info`` int32 (``...``), 0 or the
    1-based column of the first exactly-zero pivot.
    """
    n = A.shape[-1]
    batch = A.shape[:-2]
    if n == 0:
        empty = torch.zeros(batch + (0,), dtype=torch.int32, device=A.device)
        return A, empty, torch.zeros(batch, dtype=torch.int32, device=A.device)
    steps = _Steps(n, A.device)
    below_all = torch.full(batch + (n,), -1, dtype=_magnitude(A[..., :1, :1]).dtype, device=A.device)
    M = A
    pivots, zero = [], []
    for j in range(n):
        p = _pivot_rows(_magnitude(M[..., :, j]), j, steps, below_all)
        M = _swap_rows(M, j, p, steps)
        pivots.append(p)
        pivot = M[..., j:j + 1, j:j + 1]
        zero.append(pivot[..., 0, 0] == 0)
        # LAPACK scales the column only below a nonzero pivot; the update runs either way
        M = torch.where(steps.column[j] & (pivot != 0), M / pivot, M)
        M = torch.where(steps.trailing[j], M - M[..., :, j:j + 1] * M[..., j:j + 1, :], M)
    piv = (torch.stack(pivots, dim=-1) + 1).to(torch.int32)
    return M, piv, _first_zero(zero, steps)


def _conj(x: torch.Tensor) -> torch.Tensor:
    return x.conj() if x.is_complex() else x


def lu_solve(LU: torch.Tensor, pivots: torch.Tensor, B: torch.Tensor, adjoint: bool = False) -> torch.Tensor:
    """X with ``A X = B`` (``A^H X = B`` when ``adjoint``) from ``lu_factor(A)``; batch dims broadcast.

    B is ``(..., n, k)``; the result is a new tensor of the broadcast shape.
    """
    batch = torch.broadcast_shapes(LU.shape[:-2], B.shape[:-2])
    n, k = B.shape[-2], B.shape[-1]
    X = B.expand(*batch, n, k)
    if n == 0:
        return X
    LU = LU.expand(*batch, n, n)
    pivots = pivots.expand(*batch, n).to(torch.int64) - 1
    steps = _Steps(n, B.device)
    if not adjoint:
        for j in range(n):  # X = P B
            X = _swap_rows(X, j, pivots[..., j], steps)
        for j in range(n):  # L y = P B, L unit lower
            X = torch.where(steps.below[j], X - LU[..., :, j:j + 1] * X[..., j:j + 1, :], X)
        for j in reversed(range(n)):  # U x = y
            X = torch.where(steps.at[j], X / LU[..., :, j:j + 1], X)
            X = torch.where(steps.above[j], X - LU[..., :, j:j + 1] * X[..., j:j + 1, :], X)
        return X
    for j in range(n):  # U^H z = B, lower with diagonal conj(U_jj)
        u_row = _conj(LU[..., j:j + 1, :]).mT  # column j of U^H
        X = torch.where(steps.at[j], X / u_row, X)
        X = torch.where(steps.below[j], X - u_row * X[..., j:j + 1, :], X)
    for j in reversed(range(n)):  # L^H w = z, unit upper
        l_row = _conj(LU[..., j:j + 1, :]).mT  # column j of L^H
        X = torch.where(steps.above[j], X - l_row * X[..., j:j + 1, :], X)
    for j in reversed(range(n)):  # x = P^T w: the swaps undone in reverse order
        X = _swap_rows(X, j, pivots[..., j], steps)
    return X


def solve_ex(A: torch.Tensor, B: torch.Tensor, left: bool = True
             ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(result, LU, pivots, info)`` as CPU ``aten::_linalg_solve_ex`` computes them.

    Shapes and dtypes must already be valid (the caller runs torch's own checks);
    strides are the caller's business too.
    """
    LU, pivots, info = lu_factor(A)
    vector = is_vector_rhs(A, B)
    rhs = B.unsqueeze(-1) if vector else B
    if not left:  # X A = B  <=>  A^H X^H = B^H
        rhs = _conj(rhs).mT
    X = lu_solve(LU, pivots, rhs, adjoint=not left)
    if not left:
        X = _conj(X).mT
    if vector:
        X = X.squeeze(-1)
    return X, LU, pivots, info
