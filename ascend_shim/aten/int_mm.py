"""An NPU kernel for ``aten::_int_mm``, registered with torch's dispatcher.

No torch_npu release implements ``aten::_int_mm``; its calls reach
torch_npu's boxed CPU fallback. A kernel registered for the NPU's dispatch
key (PrivateUse1) wins over that fallback for every caller:
``torch._int_mm``, ``torch.ops.aten._int_mm``, comfy-kitchen's eager INT8
paths and C++. The kernel computes the exact int32 product on the device:
on the INT8 cube (``npu_quant_matmul`` with int32 output) where a one-call
probe shows that exact, else with fp32 GEMMs over K-chunks
(``int_mm_path``). It also serves ``aten::int8_mm`` where a torch release
defines it. It is registered only for the overloads torch_npu has no kernel
of its own for, so a torch_npu that implements ``_int_mm`` keeps serving it.
"""

from __future__ import annotations

import threading
from typing import Any, Callable, Dict, Optional, Tuple

import torch

from ascend_shim.aten import dispatcher, int_mm_path
from ascend_shim.aten.dispatcher import DISPATCH_KEY, has_device_kernel
from ascend_shim.aten.dispatcher import qualified as _qualified
from ascend_shim.engine.npu import is_out_of_memory

OVERLOADS = ("_int_mm", "_int_mm.out")
# kitchen's eager ``fast_int8_mm`` calls ``torch.int8_mm`` where torch has it (no release so far)
INT8_MM_OVERLOADS = ("int8_mm", "int8_mm.out")
_A_DTYPES = (torch.int8, torch.uint8)


def _defined(overload: str) -> bool:
    """Whether this torch defines ``aten::<overload>`` as ``(self, mat2[, *, out])``, like ``_int_mm``."""
    name, _, overload_name = overload.partition(".")
    try:
        schema = torch._C._get_schema("aten::" + name, overload_name)
    except RuntimeError:
        return False
    names = [argument.name for argument in schema.arguments]
    return names == (["self", "mat2", "out"] if overload_name == "out" else ["self", "mat2"])


def candidate_overloads(defined: Callable[[str], bool] = _defined) -> Tuple[str, ...]:
    """``_int_mm`` overloads, and ``int8_mm``'s where this torch defines them."""
    return OVERLOADS + tuple(o for o in INT8_MM_OVERLOADS if defined(o))

def check_operands(a, b):
    """Raise what CPU ``_int_mm`` raises for operands it refuses.

    CPU reads ``self.size(0)`` and ``mat2.size(1)`` first (IndexError), then
    checks dtypes, dimensions and K (RuntimeError). No M/K/N alignment rule:
    that is CUDA's, and the device path has none.
    """
    if a.dim() < 1 or b.dim() < 2:
        raise IndexError("_int_mm: self must be 2-D and mat2 must be 2-D, got %d and %d dimension(s)"
                         % (a.dim(), b.dim()))
    if a.dtype not in _A_DTYPES:
        raise RuntimeError("_int_mm: Expected self dtype to be int8 or uint8 but got %s" % a.dtype)
    if b.dtype != torch.int8:
        raise RuntimeError("_int_mm: Expected mat2 dtype to be of type int8 but got %s" % b.dtype)
    if a.dim() != 2:
        raise RuntimeError("_int_mm: Expected self to be of dimension 2 but got %d" % a.dim())
    if b.dim() != 2:
        raise RuntimeError("_int_mm: Expected mat2 to be of dimension 2 but got %d" % b.dim())
    if a.size(1) != b.size(0):
        raise RuntimeError("_int_mm: self.size(1) needs to match mat2.size(0) but got %d and %d"
                           % (a.size(1), b.size(0)))
    if a.device != b.device:
        raise RuntimeError("Expected all tensors to be on the same device, but found at least "
                           "two devices, %s and %s!" % (a.device, b.device))



class IntMmRegistration:
    """The shim's PrivateUse1 kernels for ``_int_mm`` (and ``int8_mm``), installed and removed as one.

    ``install`` registers a kernel for each overload torch_npu has none of its
    own for; ``uninstall`` removes exactly those. Each installation decides its
    arithmetic afresh (``int_mm_path.ProductPath``) on its first call.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._library: Any = None
        self._registered: Tuple[str, ...] = ()
        self._calls = 0
        self._reason = "not registered"
        self.path = int_mm_path.ProductPath()

    # ------------------------------------------------------------------ kernels
    def _count(self) -> None:
        with self._lock:
            self._calls += 1

    def _device_product(self, a: Any, b: Any) -> Any:
        """The exact product on the device; a device failure says it was not the caller's input."""
        try:
            return self.path.product(a, b)
        except RuntimeError as exc:
            if is_out_of_memory(exc):
                raise
            raise RuntimeError("ascend_shim: the NPU could not compute aten::_int_mm "
                               "(the operands are valid): %s" % exc) from exc

    def int_mm(self, a: Any, b: Any) -> Any:
        """The PrivateUse1 kernel of ``aten::_int_mm``."""
        check_operands(a, b)
        self._count()
        return self._device_product(a, b)

    def int_mm_out(self, a: Any, b: Any, *, out: Any) -> Any:
        """The PrivateUse1 kernel of ``aten::_int_mm.out``."""
        check_operands(a, b)
        if out.dtype != torch.int32:
            raise RuntimeError("_int_mm: Expected result dtype to be of type kInt but got %s" % out.dtype)
        self._count()
        result = self._device_product(a, b)
        out.resize_(result.shape)
        out.copy_(result)
        return out

    def _kernel(self, overload: str) -> Callable[..., Any]:
        return self.int_mm_out if overload.endswith(".out") else self.int_mm

    # ------------------------------------------------------------------ lifecycle
    def install(self, ops: Any = None) -> str:
        """Register the kernel for each overload torch_npu lacks; returns a note. Idempotent."""
        with self._lock:
            if self._library is not None:
                return self._reason
            missing = [o for o in candidate_overloads() if not has_device_kernel(o)]
            if not missing:
                self._reason = "torch_npu has its own kernels"
                return self._reason
            library = torch.library.Library("aten", "IMPL")
            for overload in missing:
                library.impl(overload, self._kernel(overload), DISPATCH_KEY)
            self._library, self._registered = library, tuple(missing)
            self.path = int_mm_path.ProductPath(ops)
            self._reason = "exact %s on the NPU for %s" % (_qualified(OVERLOADS[0]), ", ".join(missing))
            return self._reason

    def uninstall(self) -> None:
        """Remove the shim's kernels; calls reach torch_npu's CPU fallback again. Idempotent."""
        with self._lock:
            if self._library is None:
                return
            dispatcher.remove(self._library)
            self._library, self._registered, self._reason = None, (), "removed"

    def decide_now(self) -> None:
        """Decide the arithmetic now, on the current NPU (``status`` asks; else the first call does)."""
        npu = getattr(torch, "npu", None)
        if not self.registered() or npu is None:
            return
        try:
            self.path.decide(torch.device("npu", npu.current_device()))
        except Exception:  # status must still print; the kernel's first call decides then
            return

    def registered(self) -> Tuple[str, ...]:
        """The overloads the shim serves now."""
        with self._lock:
            return self._registered

    def served_elsewhere(self) -> Optional[str]:
        """None, or why the shim's kernel is not needed (torch_npu has its own)."""
        ours = set(self.registered())
        others = [o for o in OVERLOADS if o not in ours and has_device_kernel(o)]
        if len(others) == len(OVERLOADS):
            return "torch_npu has its own %s kernel for %s" % (_qualified(OVERLOADS[0]), DISPATCH_KEY)
        return None

    def report(self) -> Dict[str, Any]:
        """What ``status`` shows: the overloads served, how often, and by which arithmetic."""
        with self._lock:
            out: Dict[str, Any] = {"registered": list(self._registered), "calls": self._calls,
                                   "note": self._reason}
        if out["registered"]:
            out.update(self.path.report())
        return out

    def reset_calls(self) -> None:
        with self._lock:
            self._calls = 0


REGISTRATION = IntMmRegistration()

# The module's face, used by the patch, selftest and fp8_effective.
register = REGISTRATION.install
deregister = REGISTRATION.uninstall
registered = REGISTRATION.registered
served_elsewhere = REGISTRATION.served_elsewhere
report = REGISTRATION.report
reset_calls = REGISTRATION.reset_calls


# -- the on-device check ``selftest`` reports ---------------------------------

def _check_operands(m, k, n):
    """int8 operands whose int32 products need every K-chunk: odd sums beyond 2**24."""
    generator = torch.Generator().manual_seed(0)
    a = torch.randint(-128, 128, (m, k), dtype=torch.int8, generator=generator)
    b = torch.randint(-128, 128, (k, n), dtype=torch.int8, generator=generator)
    a[0] = -128
    b[:, 0] = -128
    a[0, ::3] = 127
    a[0, -1] = b[-1, 0] = 1  # an odd sum: fp32 rounds it once it passes 2**24
    return a, b


def _timed(function, device, repeat):
    import time

    function()  # warm
    synchronize = getattr(getattr(torch, "npu", None), "synchronize", None)
    start = time.perf_counter()
    for _ in range(repeat):
        out = function()
    if synchronize is not None:
        synchronize(device)
    return out, (time.perf_counter() - start) / repeat * 1e6


def _compare(got: Any, want: Any) -> Dict[str, Any]:
    got = got.cpu()
    if got.dtype != want.dtype or got.shape != want.shape:
        return {"exact": False, "mismatches": None}
    return {"exact": bool(torch.equal(got, want)), "mismatches": int((got != want).sum().item())}


def device_check(device: Any, ops: Any = None, shape: Tuple[int, int, int] = (64, 4096, 256),
                 repeat: int = 5) -> Dict[str, Any]:
    """``aten::_int_mm`` on ``device`` and both of the kernel's paths, bit for bit against the CPU.

    ``int_mm_*``: what ``torch._int_mm`` answers now. ``fp32_chunks`` and
    ``quant_matmul_int32`` (``npu_quant_matmul`` int32 output, unit scale):
    each path forced, with its time and whether it equals the other;
    ``probe``: what a fresh installation's one-call probe would decide here.
    ``ops`` is torch_npu (None: no ``npu_quant_matmul``).
    """
    a, b = _check_operands(*shape)
    want = torch._int_mm(a, b)
    da, db = a.to(device), b.to(device)
    report: Dict[str, Any] = {"shape": list(shape),
                              "kernel": "shim" if registered() else "torch_npu / fallback",
                              "path": REGISTRATION.path.report()["path"] if registered() else None}
    try:
        got, report["int_mm_us"] = _timed(lambda: torch._int_mm(da, db), device, repeat)
        report["int_mm_exact"] = _compare(got, want)["exact"]
    except RuntimeError as exc:
        report["int_mm_error"] = "%s: %s" % (type(exc).__name__, exc)
    path = int_mm_path.ProductPath(ops if ops is not None else _NoOps())
    got, us = _timed(lambda: path.forced(da, db, cube=False), device, repeat)
    fp32 = got.cpu()
    report["fp32_chunks"] = dict(_compare(fp32, want), us=us)
    if getattr(ops, "npu_quant_matmul", None) is None:
        report["quant_matmul_int32"] = "torch_npu has no npu_quant_matmul"
        return report
    report["probe"] = dict(zip(("usable", "why"), path._probe(device)))
    try:
        got, us = _timed(lambda: path.forced(da, db, cube=True), device, repeat)
    except (RuntimeError, TypeError, ValueError) as exc:
        report["quant_matmul_int32"] = "not available: %s: %s" % (type(exc).__name__, exc)
        return report
    report["quant_matmul_int32"] = dict(_compare(got, want), us=us,
                                        same_as_fp32_chunks=bool(torch.equal(got.cpu(), fp32)))
    return report


class _NoOps:
    """torch_npu without ``npu_quant_matmul``: the cube path is not there."""


PATHS_CHECK = "_int_mm kernel paths on the device: INT8 cube vs fp32 K-chunks, bit for bit"


def paths_check(device: Any, ops: Any) -> Dict[str, Any]:
    """``selftest``'s result for the two paths of the kernel, from ``device_check``.

    Fails when the fp32-chunk path is inexact, or when the cube path is
    inexact on a device whose probe would trust it (a wrong number served
    silently). A cube path the probe refuses is reported, not failed.
    """
    report = device_check(device, ops, repeat=1)
    failures = []
    if not report["fp32_chunks"]["exact"]:
        failures.append("the fp32 K-chunk path differs from CPU torch._int_mm in %s elements"
                        % report["fp32_chunks"]["mismatches"])
    cube = report["quant_matmul_int32"]
    probe = report.get("probe") or {}
    if isinstance(cube, dict) and not cube["exact"] and probe.get("usable"):
        failures.append("npu_quant_matmul int32 passed the probe but differs from CPU torch._int_mm in "
                        "%s elements: the kernel would serve wrong numbers" % cube["mismatches"])
    return {"name": PATHS_CHECK,
            "served_by": report["path"] or report["kernel"], "passed": not failures,
            "failures": failures, "report": report,
            "calls": [{"call": "npu_quant_matmul(x1, x2, ones, output_dtype=torch.int32) and fp32 "
                               "torch.mm over K-chunks", "arguments": {"shape": report["shape"]}}]}
