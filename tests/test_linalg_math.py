"""``ascend_shim.npu_math.linalg``: the LU solve the NPU kernel computes, on CPU tensors against torch's CPU.

Stated bound, tested here: for a system of order ``n`` in float32 (float64),
the normwise relative error (inf-norm) of the solution against a float64 solve
of the same system is at most ``n * u * cond_inf(A)``, ``u = 2**-24``; in
float64, against the CPU's float64 solve, at most twice that, ``u = 2**-53``. Beyond the numbers, the outputs mean what the
CPU's mean: ``LU``, ``pivots`` and ``info`` are LAPACK's, and singular or
non-finite systems give the CPU's infs, NaNs and ``info``.
"""

import pytest
import torch

from ascend_shim.npu_math import linalg

U = {torch.float32: 2.0 ** -24, torch.float64: 2.0 ** -53}


def cpu(A, B, left=True):
    return torch.ops.aten._linalg_solve_ex(A, B, left=left)


def same_nonfinite(a, b):
    return torch.equal(torch.isnan(a), torch.isnan(b)) and torch.equal(torch.isinf(a), torch.isinf(b))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("n", [1, 2, 3, 4, 6, 16, 64])
def test_error_within_the_stated_bound(dtype, n):
    generator = torch.Generator().manual_seed(n)
    A = torch.randn(8, n, n, generator=generator, dtype=torch.float64)
    A[0] = torch.vander(torch.linspace(-2, 3, n, dtype=torch.float64), increasing=True)  # sa_solver's kind
    B = torch.randn(8, n, 3, generator=generator, dtype=torch.float64)
    A, B = A.to(dtype).double(), B.to(dtype).double()  # the system the kernel is given, exactly
    want = torch.linalg.solve(A, B)
    got = linalg.solve_ex(A.to(dtype), B.to(dtype))[0].double()
    cond = torch.linalg.cond(A, float("inf"))
    err = (got - want).abs().amax(dim=(-2, -1)) / want.abs().amax(dim=(-2, -1))
    both = 2 if dtype == torch.float64 else 1  # float64: against the CPU's float64, itself within the bound
    assert (err <= both * n * U[dtype] * cond).all(), (err, cond)


def test_outputs_are_the_cpus_lapack_outputs():
    generator = torch.Generator().manual_seed(0)
    for A, B in ((torch.randn(5, 5, generator=generator), torch.randn(5, generator=generator)),
                 (torch.randn(5, 5, generator=generator).mT, torch.randn(5, 2, generator=generator)),
                 (torch.randn(2, 1, 4, 4, generator=generator), torch.randn(3, 4, 2, generator=generator))):
        result, LU, pivots, info = linalg.solve_ex(A, B)
        want = cpu(A, B)
        assert result.shape == want[0].shape
        torch.testing.assert_close(result, want[0], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(LU, want[1], rtol=1e-5, atol=1e-5)
        assert torch.equal(pivots, want[2]) and pivots.dtype == torch.int32
        assert torch.equal(info, want[3]) and info.dtype == torch.int32


def test_vector_and_matrix_right_hand_sides_and_broadcasting():
    generator = torch.Generator().manual_seed(1)
    A = torch.randn(3, 4, 4, generator=generator)
    for B in (torch.randn(4, generator=generator),  # one vector for every matrix
              torch.randn(3, 4, generator=generator),  # a batch of vectors (NumPy's rule)
              torch.randn(4, 2, generator=generator),  # one matrix for every matrix
              torch.randn(2, 1, 4, 2, generator=generator)):  # batch dims broadcast
        want = torch.linalg.solve(A, B)
        got = linalg.solve_ex(A, B)[0]
        assert got.shape == want.shape, B.shape
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("contiguous", [True, False])
def test_left_false_solves_x_a_equals_b(contiguous):
    generator = torch.Generator().manual_seed(2)
    A = torch.randn(4, 4, generator=generator)
    A = A if contiguous else A.mT
    B = torch.randn(3, 4, generator=generator)
    torch.testing.assert_close(linalg.solve_ex(A, B, left=False)[0], torch.linalg.solve(A, B, left=False))


def test_complex_like_the_cpu():
    generator = torch.Generator().manual_seed(3)
    A = torch.randn(4, 4, dtype=torch.complex64, generator=generator)
    B = torch.randn(4, 2, dtype=torch.complex64, generator=generator)
    for left in (True, False):
        rhs = B if left else B.mT
        torch.testing.assert_close(linalg.solve_ex(A, rhs, left)[0], torch.linalg.solve(A, rhs, left=left))


def test_singular_systems_give_the_cpus_info_and_values():
    b = torch.tensor([1.0, 2.0])
    for A in (torch.tensor([[1.0, 2.0], [2.0, 4.0]]), torch.zeros(2, 2), torch.ones(2, 2),
              torch.stack([torch.eye(2), torch.zeros(2, 2)])):
        result, _, pivots, info = linalg.solve_ex(A, b)
        want = cpu(A, b)
        assert torch.equal(info, want[3]) and int(info.max()) > 0, A
        assert torch.equal(pivots, want[2]), A
        assert same_nonfinite(result, want[0]), (result, want[0])


def test_non_finite_inputs_give_the_cpus_infs_and_nans():
    generator = torch.Generator().manual_seed(4)
    specials = (float("nan"), float("inf"), -float("inf"))
    checked = 0
    for trial in range(200):
        n = int(torch.randint(2, 6, (), generator=generator))
        A, B = torch.randn(n, n, generator=generator), torch.randn(n, generator=generator)
        i, j, which = (int(v) for v in torch.randint(0, n, (3,), generator=generator))
        if trial % 3:
            A[i, j] = specials[which % 3]
        else:
            B[i] = specials[which % 3]
        want = torch.linalg.solve_ex(A, B)
        result, _, _, info = linalg.solve_ex(A, B)
        assert same_nonfinite(result, want.result), (A, B, result, want.result)
        assert torch.equal(info, want.info)
        checked += int(not torch.isfinite(want.result).all())
    assert checked > 100  # most of them do reach the result


def test_empty_systems():
    for A, B in ((torch.randn(0, 3, 3), torch.randn(3)), (torch.randn(0, 0), torch.randn(0)),
                 (torch.randn(3, 3), torch.randn(3, 0))):
        want = cpu(A, B)
        got = linalg.solve_ex(A, B)
        assert [t.shape for t in got] == [t.shape for t in want]


def test_ties_pick_the_first_row_like_lapack():
    A = torch.tensor([[1.0, 2.0, 0.0], [-1.0, 3.0, 1.0], [1.0, 0.0, 5.0]])
    _, _, pivots, _ = linalg.solve_ex(A, torch.ones(3))
    assert torch.equal(pivots, cpu(A, torch.ones(3))[2])
    assert pivots[0] == 1
