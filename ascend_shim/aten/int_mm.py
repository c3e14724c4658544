"""An NPU kernel for ``aten::_int_mm``, registered with torch's dispatcher.

No torch_npu release implements ``aten::_int_mm``; its calls reach
torch_npu's boxed CPU fallback. A kernel registered for the NPU's dispatch
key (PrivateUse1) wins over that fallback for every caller:
``torch._int_mm``, ``torch.ops.aten._int_mm``, comfy-kitchen's eager INT8
paths and C++. The kernel computes the exact int32 product on the
device (``int8_math.exact_int_mm``). It is registered only for the overloads
torch_npu has no kernel of its own for, so a torch_npu that implements
``_int_mm`` keeps serving it.
"""

import threading

import torch

from ascend_shim.engine.npu import is_out_of_memory
from ascend_shim.npu_math import int8 as int8_math

DISPATCH_KEY = "PrivateUse1"
OVERLOADS = ("_int_mm", "_int_mm.out")
_A_DTYPES = (torch.int8, torch.uint8)

_lock = threading.Lock()
_state = {"library": None, "registered": (), "calls": 0, "reason": "not registered"}


def _qualified(overload):
    return "aten::" + overload


def has_device_kernel(overload):
    """Whether the dispatcher holds a PrivateUse1 kernel for this overload."""
    return torch._C._dispatch_has_kernel_for_dispatch_key(_qualified(overload), DISPATCH_KEY)


def served_elsewhere():
    """None, or why the shim's kernel is not needed (torch_npu has its own)."""
    with _lock:
        ours = set(_state["registered"])
    others = [o for o in OVERLOADS if o not in ours and has_device_kernel(o)]
    if len(others) == len(OVERLOADS):
        return "torch_npu has its own %s kernel for %s" % (_qualified(OVERLOADS[0]), DISPATCH_KEY)
    return None


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


def _count():
    with _lock:
        _state["calls"] += 1


def _device_product(a, b):
    """The exact product on the device; a device failure says it was not the caller's input."""
    try:
        return int8_math.exact_int_mm(a, b)
    except RuntimeError as exc:
        if is_out_of_memory(exc):
            raise
        raise RuntimeError("ascend_shim: the NPU could not run the fp32 GEMMs of aten::_int_mm "
                           "(the operands are valid): %s" % exc) from exc


def int_mm(a, b):
    """The PrivateUse1 kernel of ``aten::_int_mm``."""
    check_operands(a, b)
    _count()
    return _device_product(a, b)


def int_mm_out(a, b, *, out):
    """The PrivateUse1 kernel of ``aten::_int_mm.out``."""
    check_operands(a, b)
    if out.dtype != torch.int32:
        raise RuntimeError("_int_mm: Expected result dtype to be of type kInt but got %s" % out.dtype)
    _count()
    result = _device_product(a, b)
    out.resize_(result.shape)
    out.copy_(result)
    return out


_KERNELS = {"_int_mm": int_mm, "_int_mm.out": int_mm_out}


def register():
    """Register the kernel for each overload torch_npu lacks; returns a note."""
    with _lock:
        if _state["library"] is not None:
            return _state["reason"]
        missing = [o for o in OVERLOADS if not has_device_kernel(o)]
        if not missing:
            _state["reason"] = "torch_npu has its own kernels"
            return _state["reason"]
        library = torch.library.Library("aten", "IMPL")
        for overload in missing:
            library.impl(overload, _KERNELS[overload], DISPATCH_KEY)
        _state.update(library=library, registered=tuple(missing))
        _state["reason"] = "exact %s on the NPU for %s" % (
            _qualified(OVERLOADS[0]), ", ".join(missing))
        return _state["reason"]


def deregister():
    """Remove the shim's kernels; calls reach torch_npu's CPU fallback again."""
    with _lock:
        library = _state["library"]
        if library is None:
            return
        destroy = getattr(library, "_destroy", None)
        if destroy is None:
            raise RuntimeError("this torch cannot remove a torch.library registration")
        destroy()
        _state.update(library=None, registered=(), reason="removed")


def registered():
    """The overloads the shim serves now."""
    with _lock:
        return tuple(_state["registered"])


def report():
    """What ``status`` shows: which overloads are served and how often."""
    with _lock:
        return {"registered": list(_state["registered"]), "calls": _state["calls"],
                "note": _state["reason"]}


def reset_calls():
    with _lock:
        _state["calls"] = 0


# -- the on-device check ``selftest`` reports ---------------------------------

def _check_operands(m, k, n):
    """int8 operands whose int32 products need every K-chunk: odd sums beyond 2**24."""
    generator = torch.Generator().manual_seed(0)
    a = torch.randint(-128, 128, (m, k), dtype=torch.int8, generator=generator)
    b = torch.randint(-128, 128, (k, n), dtype=torch.int8, generator=generator)
    a[0] = -128
    b[:, 0] = -128
    a[0, ::3] = 127
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


def device_check(device, ops=None, shape=(64, 4096, 256), repeat=5):
    """Is ``aten::_int_mm`` on ``device`` exact against the CPU, and how fast?

    Also asks whether ``npu_quant_matmul`` with int32 output and a unit scale
    (op-plugin 7.0.0+; its vendor test is skipped, so unverified) is exact and faster: a candidate
    for a later default, reported, never used here. ``ops`` is torch_npu.
    """
    a, b = _check_operands(*shape)
    want = torch._int_mm(a, b)
    da, db = a.to(device), b.to(device)
    report = {"shape": list(shape), "kernel": "shim" if registered() else "torch_npu / fallback"}
    try:
        got, report["int_mm_us"] = _timed(lambda: torch._int_mm(da, db), device, repeat)
        report["int_mm_exact"] = bool(torch.equal(got.cpu(), want))
    except RuntimeError as exc:
        report["int_mm_error"] = "%s: %s" % (type(exc).__name__, exc)
    quant_matmul = getattr(ops, "npu_quant_matmul", None)
    if quant_matmul is None:
        report["quant_matmul_int32"] = "torch_npu has no npu_quant_matmul"
        return report
    unit = torch.ones(1, dtype=torch.float32, device=device)
    try:
        got, us = _timed(lambda: quant_matmul(da, db, unit, output_dtype=torch.int32), device, repeat)
        report["quant_matmul_int32"] = {"exact": bool(torch.equal(got.cpu(), want)), "us": us}
    except (RuntimeError, TypeError, ValueError) as exc:
        report["quant_matmul_int32"] = "not available: %s: %s" % (type(exc).__name__, exc)
    return report
