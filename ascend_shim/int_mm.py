"""An NPU kernel for ``aten::_int_mm``, registered with torch's dispatcher.

No torch_npu release implements ``aten::_int_mm``; its calls reach
torch_npu's boxed CPU fallback. A kernel registered for the NPU's dispatch
key (PrivateUse1) wins over that fallback for every caller:
``torch._int_mm``, ``torch.ops.aten._int_mm``, comfy-kitchen's eager INT8
paths and C++ (FACTS 7.3). The kernel computes the exact int32 product on the
device (``int8_math.exact_int_mm``). It is registered only for the overloads
torch_npu has no kernel of its own for, so a torch_npu that implements
``_int_mm`` keeps serving it.
"""

import threading

import torch

from ascend_shim.kitchen import int8_math

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


def int_mm(a, b):
    """The PrivateUse1 kernel of ``aten::_int_mm``."""
    check_operands(a, b)
    _count()
    return int8_math.exact_int_mm(a, b)


def int_mm_out(a, b, *, out):
    """The PrivateUse1 kernel of ``aten::_int_mm.out``."""
    check_operands(a, b)
    if out.dtype != torch.int32:
        raise RuntimeError("_int_mm: Expected result dtype to be of type kInt but got %s" % out.dtype)
    _count()
    result = int8_math.exact_int_mm(a, b)
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
