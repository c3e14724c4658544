"""NPU kernels for ``aten::_linalg_solve_ex`` and ``aten::lgamma``, registered with torch's dispatcher.

torch_npu 2.12.0 registers neither (both are structured ops whose out
overload it lacks), so ComfyUI's ``uni_pc`` / ``uni_pc_bh2``
(``torch.linalg.solve`` every step) and ``sa_solver`` / ``sa_solver_pece``
(``Tensor.lgamma`` and ``torch.linalg.solve``) run them through torch_npu's
CPU fallback. A kernel registered for the NPU's key (PrivateUse1) wins over
that fallback for every caller: ``torch.linalg.solve``, ``linalg.solve_ex``
(both reach ``_linalg_solve_ex``), ``torch.lgamma``, ``Tensor.lgamma``, C++.

The arithmetic is ``npu_math.linalg`` (Gaussian elimination with partial
pivoting, LAPACK's conventions) and ``npu_math.special.lgamma``, from ops
the real registry has. torch's own shape, dtype and broadcast checks run
first, on meta tensors: the errors are the CPU's, word for word. A singular
matrix gives ``info`` > 0 as the CPU's LAPACK does, and ``torch.linalg.solve``
raises ``torch.linalg.LinAlgError`` from it through torch's own
``_linalg_check_errors``. Half and bfloat16 are refused for solve as the
CPU refuses them (``NotImplementedError``); lgamma computes them in float32
as the CPU does. Only the overloads torch_npu has no kernel of its own for
are registered, so a torch_npu that implements them keeps serving them.
The out= forms (``_linalg_solve_ex.result``, ``lgamma.out``) stay with
torch_npu.
"""

from __future__ import annotations

import threading
from typing import Any, Callable, Dict, Tuple

import torch

from ascend_shim.aten import dispatcher
from ascend_shim.aten.dispatcher import DISPATCH_KEY, has_device_kernel
from ascend_shim.aten.dispatcher import qualified as _qualified
from ascend_shim.engine.npu import is_out_of_memory
from ascend_shim.npu_math import linalg, special

SOLVE = "_linalg_solve_ex"
LGAMMA = "lgamma"
LGAMMA_ = "lgamma_"
OVERLOADS = (SOLVE, LGAMMA, LGAMMA_)
_COMPLEX = {torch.complex64: "ComplexFloat", torch.complex128: "ComplexDouble"}
_LOW_PRECISION = {torch.float16: "Half", torch.bfloat16: "BFloat16"}  # as torch names them in errors


def _meta(t: torch.Tensor) -> torch.Tensor:
    """A data-less twin of ``t`` (shape, strides, dtype) on which torch's checks run."""
    return torch.empty_strided(tuple(t.shape), tuple(t.stride()), dtype=t.dtype, device="meta")


def _same_device(*tensors: torch.Tensor) -> None:
    first = tensors[0].device
    for t in tensors[1:]:
        if t.device != first:
            raise RuntimeError("Expected all tensors to be on the same device, but found at least "
                               "two devices, %s and %s!" % (first, t.device))


def _shaped(value: torch.Tensor, like: torch.Tensor, device: Any) -> torch.Tensor:
    """``value`` in a new tensor with ``like``'s (meta) shape, strides and dtype."""
    out = torch.empty_strided(tuple(like.shape), tuple(like.stride()), dtype=like.dtype, device=device)
    out.copy_(value)
    return out


def _on_device(op: str, compute: Callable[[], Any]) -> Any:
    """``compute()``; a device failure (not out of memory) says it was not the caller's input."""
    try:
        return compute()
    except RuntimeError as exc:
        if is_out_of_memory(exc):
            raise
        raise RuntimeError("ascend_shim: the NPU could not compute %s (the operands are valid; "
                           "ASCEND_SHIM_DISABLE=sampler_ops leaves it to torch_npu's CPU fallback): %s"
                           % (_qualified(op), exc)) from exc


def solve_ex(A: torch.Tensor, B: torch.Tensor, *, left: bool = True,
             check_errors: bool = False) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``aten::_linalg_solve_ex`` on the device: CPU's checks, results, strides and errors."""
    _same_device(A, B)
    try:
        shapes = torch.ops.aten._linalg_solve_ex(_meta(A), _meta(B), left=left, check_errors=False)
    except AssertionError as exc:  # torch's Python meta says "A is not a matrix" so; the CPU raises RuntimeError
        raise RuntimeError(str(exc)) from None
    if A.dtype in _LOW_PRECISION:
        # the CPU's LU ("lu_cpu") has no half kernel: torch_npu's fallback raised this, so does the shim
        raise NotImplementedError("\"lu_cpu\" not implemented for '%s'" % _LOW_PRECISION[A.dtype])
    result, LU, pivots, info = _on_device(SOLVE, lambda: linalg.solve_ex(A, B, left))
    info = info.contiguous()
    if check_errors:
        torch.ops.aten._linalg_check_errors(info, "torch.linalg.solve_ex", is_matrix=A.dim() == 2)
    device = A.device
    return (_shaped(result, shapes[0], device), _shaped(LU, shapes[1], device),
            _shaped(pivots, shapes[2], device), _shaped(info, shapes[3], device))


def _lgamma_values(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """lgamma of ``x`` as the CPU computes it for a result of ``dtype``: in float64 or float32."""
    if x.is_complex():
        raise NotImplementedError("\"lgamma\" not implemented for '%s'" % _COMPLEX.get(x.dtype, x.dtype))
    compute = torch.float64 if dtype == torch.float64 else torch.float32
    return _on_device(LGAMMA, lambda: special.lgamma(x.to(compute)).to(dtype))


def lgamma(x: torch.Tensor) -> torch.Tensor:
    """``aten::lgamma`` on the device; integer and bool inputs promote as on the CPU."""
    like = torch.ops.aten.lgamma(_meta(x))
    return _lgamma_values(x, like.dtype)


def lgamma_(x: torch.Tensor) -> torch.Tensor:
    """``aten::lgamma_``: the CPU's refusal of integer ``self``, then the values in place."""
    torch.ops.aten.lgamma_(_meta(x))
    x.copy_(_lgamma_values(x, x.dtype))
    return x


class SamplerOpsRegistration:
    """The shim's PrivateUse1 kernels for these ops, installed and removed as one."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._library: Any = None
        self._registered: Tuple[str, ...] = ()
        self._calls: Dict[str, int] = {}
        self._reason = "not registered"

    def _counted(self, overload: str, kernel: Callable[..., Any]) -> Callable[..., Any]:
        def counted(*args: Any, **kwargs: Any) -> Any:
            with self._lock:
                self._calls[overload] = self._calls.get(overload, 0) + 1
            return kernel(*args, **kwargs)

        counted.__name__ = "ascend_shim_" + overload
        return counted

    def install(self) -> str:
        """Register a kernel for each overload torch_npu lacks; returns a note. Idempotent."""
        kernels: Dict[str, Callable[..., Any]] = {SOLVE: solve_ex, LGAMMA: lgamma, LGAMMA_: lgamma_}
        with self._lock:
            if self._library is not None:
                return self._reason
            missing = [o for o in OVERLOADS if not has_device_kernel(o)]
            if not missing:
                self._reason = "torch_npu has its own kernels"
                return self._reason
            library = torch.library.Library("aten", "IMPL")
            for overload in missing:
                library.impl(overload, self._counted(overload, kernels[overload]), DISPATCH_KEY)
            self._library, self._registered = library, tuple(missing)
            self._reason = "on the NPU by the shim: %s" % ", ".join(_qualified(o) for o in missing)
            return self._reason

    def uninstall(self) -> None:
        """Remove the shim's kernels; calls reach torch_npu's CPU fallback again. Idempotent."""
        with self._lock:
            if self._library is None:
                return
            dispatcher.remove(self._library)
            self._library, self._registered, self._reason = None, (), "removed"

    def registered(self) -> Tuple[str, ...]:
        with self._lock:
            return self._registered

    def served_elsewhere(self) -> Any:
        """None, or why the shim's kernels are not needed (torch_npu has all of its own)."""
        if not self.registered() and all(has_device_kernel(o) for o in OVERLOADS):
            return "torch_npu has its own %s kernels for %s" % (
                ", ".join(_qualified(o) for o in OVERLOADS), DISPATCH_KEY)
        return None

    def report(self) -> Dict[str, Any]:
        """What ``status`` shows: the overloads served and how often each was called."""
        with self._lock:
            return {"registered": [_qualified(o) for o in self._registered],
                    "calls": {_qualified(o): n for o, n in sorted(self._calls.items())},
                    "note": self._reason}

    def reset_calls(self) -> None:
        with self._lock:
            self._calls = {}


REGISTRATION = SamplerOpsRegistration()


# -- the on-device check ``selftest`` reports ---------------------------------

CHECK_NAME = "torch.linalg.solve and lgamma on the device (uni_pc, sa_solver) vs float64"
UNIT_ROUNDING = 2.0 ** -24


def sampler_systems() -> list:
    """``(name, A, b)`` in float32 as ComfyUI 0.30's samplers build them, on a karras schedule.

    uni_pc: ``R[i] = rks ** i`` with ``rks`` the lambda ratios and 1 (orders 2, 3);
    sa_solver: the transposed Vandermonde of 1..6 consecutive half-log-SNRs.
    """
    ramp = torch.linspace(0, 1, 21, dtype=torch.float64)
    low, high = 0.0292 ** (1 / 7), 14.6146 ** (1 / 7)
    lambdas = -torch.log((high + ramp * (low - high)) ** 7)  # sigma_to_half_log_snr, EPS
    systems = []
    for n in range(1, 7):
        window = lambdas[8:8 + n]
        systems.append(("sa_solver vandermonde %dx%d" % (n, n),
                        torch.vander(window, n, increasing=True).T, torch.linspace(0.5, 1.5, n, dtype=torch.float64)))
    h = lambdas[11] - lambdas[10]
    for order in (2, 3):
        rks = torch.cat([(lambdas[10 - torch.arange(1, order)] - lambdas[10]) / h, torch.ones(1, dtype=torch.float64)])
        R = torch.stack([rks ** i for i in range(order)])
        systems.append(("uni_pc R %dx%d" % (order, order), R, torch.linspace(0.2, 0.7, order, dtype=torch.float64)))
    return [(name, A.float(), b.float()) for name, A, b in systems]


def device_check(device: Any) -> Dict[str, Any]:
    """The ops as the samplers call them on ``device``, against float64 on the CPU.

    Solve: the normwise relative error within ``n * u * cond_inf(A)`` (u = 2**-24);
    a singular matrix raises ``torch.linalg.LinAlgError`` as on the CPU; lgamma of
    1..6 (sa_solver's arguments) within 8 u of float64; no op left to the CPU
    where the shim serves it.
    """
    failures = []
    rows = []
    for name, A, b in sampler_systems():
        want = torch.linalg.solve(A.double(), b.double())
        cond = float(torch.linalg.cond(A.double(), float("inf")))
        try:
            got = torch.linalg.solve(A.to(device), b.to(device)).cpu().double()
        except Exception as exc:
            failures.append("%s: torch.linalg.solve raised %s: %s" % (name, type(exc).__name__, exc))
            continue
        error = float((got - want).abs().max() / want.abs().max())
        bound = A.shape[-1] * UNIT_ROUNDING * cond
        rows.append({"system": name, "relative_error": error, "bound": bound})
        if not error <= bound:
            failures.append("%s: relative error %.3g exceeds n*u*cond = %.3g" % (name, error, bound))
    singular = torch.tensor([[1.0, 2.0], [2.0, 4.0]])
    try:
        torch.linalg.solve(singular.to(device), torch.ones(2, device=device))
        failures.append("a singular matrix gave a result instead of torch.linalg.LinAlgError")
    except torch.linalg.LinAlgError:
        pass
    except Exception as exc:
        failures.append("a singular matrix raised %s (the CPU raises LinAlgError): %s" % (type(exc).__name__, exc))
    x = torch.arange(1, 7, dtype=torch.float32)
    want_l = x.double().lgamma()
    try:
        got_l = x.to(device).lgamma().cpu().double()
        lgamma_error = float(((got_l - want_l).abs() / want_l.abs().clamp_min(1)).max())
    except Exception as exc:
        failures.append("lgamma raised %s: %s" % (type(exc).__name__, exc))
        lgamma_error = None
    if lgamma_error is not None and not lgamma_error <= 8 * UNIT_ROUNDING:
        failures.append("lgamma(1..6) off by %.3g (relative), more than 8 u" % lgamma_error)
    served = "ascend_shim" if REGISTRATION.registered() else "torch_npu"
    return {"name": CHECK_NAME, "served_by": served, "passed": not failures, "failures": failures,
            "systems": rows, "lgamma_error": lgamma_error,
            "calls": [{"call": "torch.linalg.solve", "arguments": {"A": "float32 1x1..6x6 on %s" % device}},
                      {"call": "Tensor.lgamma", "arguments": {"self": "float32 1..6 on %s" % device}}]}
