"""A simulated Ascend ``npu`` device on the CPU build of torch.

PrivateUse1 is renamed to ``npu`` and registered as a Python backend.  An npu
tensor is a wrapper subclass (:class:`NpuTensor`) whose metadata says
``device='npu:N'`` while the data lives in an ordinary CPU tensor (``.elem``).

* Ops on npu tensors arrive in ``NpuTensor.__torch_dispatch__``: they are run
  on the CPU tensors and the results re-wrapped.  Views stay views (the CPU
  tensors share storage), in-place ops return their input wrapper.
* Factories (``torch.randn(..., device="npu")``, ``cpu_t.to("npu")``) reach the
  PrivateUse1 kernels registered below for ``empty``/``empty_strided``/
  ``_copy_from``.  Those are dispatcher kernels, so they work in every thread
  (a TorchFunctionMode would be thread-local, and ComfyUI runs prompts in a
  worker thread).
* Ops outside ``aten``/``prims`` (``torch.library.custom_op`` ops such as
  ``comfy_kitchen::int8_linear``) are redispatched below the Python key, so their
  Python bodies run on the npu wrappers, as they would on a real device. A
  namespace may have a handler of its own (:func:`set_namespace_handler`): the
  simulated HCCL (testbed/hccl.py) takes the ``c10d`` ops there, which is where a
  card's ``c10d`` kernels would hand them to ProcessGroupHCCL.
* Foreign tensor subclasses (kitchen's ``QuantizedTensor``) get
  ``NotImplemented`` so that their own ``__torch_dispatch__`` runs first.
* The judge: once the fake torch_npu installs a real wheel's kernel registry
  (:func:`install_registry`, testbed/npu_registry.py), each aten op is judged by
  the dispatcher's rules: a registered NPU kernel runs on the card,
  CompositeImplicitAutograd decomposes, a structured op needs its ``.out``
  overload, CompositeExplicitAutograd runs on the card; anything else falls
  back. A fallback still computes and is counted (:func:`cpu_fallbacks`), or
  raises when ``TORCH_NPU_FALLBACK_CPU_DISABLE=1``; as in torch_npu, the first
  fallback of each op writes one c10 log line to fd 2, not a Python warning.
  ``cpu_fallback_ops()`` names ops forced to fall back on top (on the device
  alone, without torch_npu, the only ones: ``aten::_int_mm``).
* Calls outside torch_npu's documented dtype table (testbed/dtype_table.py) are
  counted in :func:`dtype_findings`; results are unchanged.
* Random ops on npu tensors draw from the card's default generator
  (:func:`default_generator`), as with torch_npu's NPU generators.

Nothing here imports ``torch_npu``; the fake ``torch_npu`` calls :func:`activate`
and hands over its ``torch.npu`` module.
"""

from __future__ import annotations

import collections
import copy
import os
import re
import threading
import time
import types
import weakref

import torch
from torch.utils._mode_utils import no_dispatch
from torch.utils._pytree import tree_flatten, tree_map

from testbed import dtype_table as _dtype_table
from testbed import npu_registry as _reg

__all__ = [
    "NpuTensor",
    "activate",
    "is_active",
    "device_count",
    "set_device_count",
    "current_device",
    "set_device",
    "thread_device",
    "implicit_binds",
    "reset_implicit_binds",
    "set_visible",
    "physical_id",
    "op_counts_by_device",
    "wrap",
    "unwrap",
    "is_npu_tensor",
    "shares_storage",
    "storage_ptr",
    "cpu_fallbacks",
    "reset_cpu_fallbacks",
    "cpu_fallback_ops",
    "set_cpu_fallback_ops",
    "DEFAULT_CPU_FALLBACK_OPS",
    "install_registry",
    "registry",
    "dtype_findings",
    "reset_dtype_findings",
    "default_generator",
    "memory_allocated",
    "max_memory_allocated",
    "reset_peak_memory_stats",
    "op_counts",
    "reset_op_counts",
    "float8_storage",
    "set_float8_storage",
    "matmul_allow_hf32",
    "set_matmul_allow_hf32",
    "set_namespace_handler",
]

DEVICE_TYPE = "npu"
DEFAULT_CPU_FALLBACK_OPS = frozenset({"aten::_int_mm"})

# Ops allowed to mix npu and (non-scalar) CPU tensors: they are device transfers. torch declares
# ``_foreach_copy_`` ``device_check: NoCheck`` (its slow path copies tensor by tensor), and torch_npu's
# kernel takes lists on two devices the same way (op-plugin: a batched host-device memcpy or that slow
# path whenever the fast route's same-device rule fails): FSDP2 gathers host-resident shards with it.
_TRANSFER_OPS = frozenset(
    {
        "aten::copy_",
        "aten::_copy_from",
        "aten::_copy_from_and_resize",
        "aten::_to_copy",
        "aten::copy",
        "aten::_foreach_copy_",
    }
)
# Like CUDA, advanced indexing accepts CPU index tensors.
_INDEX_OPS = frozenset({"aten::index", "aten::index_put_", "aten::index_put", "aten::_index_put_impl_"})
_NO_OP = frozenset({"aten::record_stream"})
# PrivateUse1 kernels the bed registers itself (factories and transfers); any
# other PrivateUse1 kernel is "a real NPU kernel" and wins over the simulation
_BED_KERNELS = frozenset(
    {"aten::empty.memory_format", "aten::empty_strided", "aten::_copy_from",
     "aten::_copy_from_and_resize", "aten::_local_scalar_dense"}
)
# fp32 GEMMs that run in HF32 while torch.npu.matmul.allow_hf32 is on. The
# bed rounds their inputs *and* results to 10 mantissa bits: on a 910B an
# int8 matmul computed in HF32 gives wrong int32 results, which rounding
# int8-valued inputs alone would never show.
# (torch_npu registers ``matmul`` itself, so it reaches the backend whole)
_MATMUL_OPS = frozenset({"aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::addbmm", "aten::matmul"})
_HF32_DROPPED_BITS = 23 - 10
_ATEN_NAMESPACES = frozenset({"aten", "prims", "prim", "debugprims"})
# CompositeExplicitAutograd kernels that alias their input in C++ without the dispatcher
# (alias_with_sizes_and_strides) though their schema says "new tensor": they run whole, as views do
_ALIASING_COMPOSITES = frozenset({"aten::_unsafe_view", "aten::lift", "aten::lift_fresh"})

_lock = threading.RLock()
_state = {
    "active": False,
    "count": 1,
    "visible": None,  # physical card of each visible index (None: 0..count-1)
    "module": None,
    "allow_hf32": False,  # torch_npu's default for matmul
    "float8": False,  # Atlas A2/A3 hold no float8 tensor; the fake torch_npu sets it per SoC
}
_fallback_ops = set(DEFAULT_CPU_FALLBACK_OPS)
_fallback_log: collections.Counter = collections.Counter()
_fallback_warned: set = set()
_op_counts: collections.Counter = collections.Counter()
_op_counts_by_device: collections.Counter = collections.Counter()  # (npu index, op name)
_count_ops = False
# The judge (install_registry): a real torch_npu's kernel registry, the bed's own kernels for it,
# each op's verdict, and the (op, dtype) calls outside torch_npu's documented dtype table.
_registry = None
_registry_kernels: dict = {}  # "aten::add.Tensor" -> torch.library key ("aten/add.Tensor/PrivateUse1")
_verdicts: dict = {}  # OpOverload -> (verdict, detail)
_dtype_findings: collections.Counter = collections.Counter()
_watching = threading.local()  # .depth > 0: inside a watched op's own pieces
# ACL binds a device to each thread (aclrtSetDevice) and torch_npu keeps the index per
# thread (c10_npu::GetDevice/SetDevice, NPUFunctions.cpp): a thread that never set one
# is bound to card 0 at its first query (older releases raised ACL error 107002, "The
# context is empty", from the allocator instead). The bed keeps the same per-thread
# state and notes every such implicit bind, so a test sees a thread that never chose.
_thread = threading.local()
_implicit_binds: list = []  # names of the threads bound to card 0 implicitly

# Live bytes per device, keyed by the CPU StorageImpl (tracked via weakref on the
# storage object, which torch keeps alive exactly as long as the StorageImpl).
_live: dict = {}
_allocated: collections.Counter = collections.Counter()
_peak: collections.Counter = collections.Counter()
_AFTER_PYTHON = None  # DispatchKeySet, set on activation


# --------------------------------------------------------------------------- state


def is_active() -> bool:
    return _state["active"]


def device_count() -> int:
    return _state["count"]


def set_device_count(n: int) -> None:
    """Number of simulated cards (torch_npu reads ``TESTBED_NPU_COUNT``)."""
    if n < 0:
        raise ValueError("device count must be >= 0")
    _state["count"] = int(n)
    _state["visible"] = None


def current_device() -> int:
    """This thread's device; a thread that never set one is bound to card 0 (noted)."""
    idx = getattr(_thread, "device", None)
    if idx is None:
        idx = _thread.device = 0
        with _lock:
            _implicit_binds.append(threading.current_thread().name)
    return idx


def set_device(device) -> None:
    idx = _index_of(device)
    _check_index(idx)
    _thread.device = idx


def thread_device() -> int | None:
    """This thread's device without binding one (None: it never set or asked)."""
    return getattr(_thread, "device", None)


def implicit_binds() -> list:
    """Names of the threads bound to card 0 because they asked before setting a device."""
    with _lock:
        return list(_implicit_binds)


def reset_implicit_binds() -> None:
    with _lock:
        _implicit_binds.clear()


def set_visible(physical: list) -> None:
    """The physical cards this process sees, in index order (ASCEND_RT_VISIBLE_DEVICES)."""
    _state["count"] = len(physical)
    _state["visible"] = [int(p) for p in physical]


def physical_id(index: int) -> int:
    """The physical card behind visible index ``index``."""
    _check_index(index)
    visible = _state["visible"]
    return index if visible is None else visible[index]


def _index_of(device) -> int:
    if isinstance(device, int):
        return device
    if isinstance(device, str):
        device = torch.device(device)
    if isinstance(device, torch.device):
        if device.type != DEVICE_TYPE:
            raise RuntimeError(f"Invalid device, must be {DEVICE_TYPE} device, got {device}")
        return current_device() if device.index is None else device.index
    if device is None:
        return current_device()
    raise TypeError(f"unsupported device spec {device!r}")


def _check_index(idx: int) -> None:
    n = _state["count"]
    if n == 0:
        raise RuntimeError("npu device not available: the simulated machine has no NPU (TESTBED_NPU_COUNT=0)")
    if not 0 <= idx < n:
        raise RuntimeError(f"Invalid device npu:{idx}: the simulated machine has {n} NPU(s)")


# --------------------------------------------------------------------------- tensor


class NpuTensor(torch.Tensor):
    """Wrapper tensor: npu metadata, CPU data in ``.elem`` (same sizes/strides)."""

    elem: torch.Tensor

    @staticmethod
    def __new__(cls, elem: torch.Tensor, index: int = 0, requires_grad: bool | None = None):
        if isinstance(elem, NpuTensor) or elem.device.type != "cpu":
            raise TypeError(f"NpuTensor wraps a CPU tensor, got {type(elem).__name__} on {elem.device}")
        _refuse_float8(elem.dtype)
        if requires_grad is None:
            requires_grad = elem.requires_grad
        if elem.requires_grad:
            elem = elem.detach()
        r = torch.Tensor._make_wrapper_subclass(
            cls,
            elem.size(),
            strides=elem.stride(),
            storage_offset=elem.storage_offset(),
            dtype=elem.dtype,
            layout=elem.layout,
            device=torch.device(DEVICE_TYPE, index),
            requires_grad=requires_grad,
        )
        r.elem = elem
        _track(elem, index)
        return r

    # Dispatch-level only: with torch-function disabled, a foreign subclass's
    # __torch_function__ (e.g. QuantizedTensor's default one) still runs.
    __torch_function__ = torch._C._disabled_torch_function_impl

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        for t in types:
            if not issubclass(t, NpuTensor):
                return NotImplemented
        return _dispatch(func, args, kwargs or {})

    # -- storage identity: report the CPU storage so "shares storage" checks work
    def data_ptr(self) -> int:
        return self.elem.data_ptr()

    def untyped_storage(self):
        return self.elem.untyped_storage()

    def storage(self):
        return self.elem.storage()

    def tolist(self):
        return self.elem.tolist()

    def numpy(self, *, force: bool = False):
        if force:
            return self.elem.detach().numpy()
        raise TypeError(
            f"can't convert {self.device} device type tensor to numpy. Use Tensor.cpu() to "
            "copy the tensor to host memory first."
        )

    # ``param.data = other`` shallow-copies metadata in C++; keep .elem in step.
    @property
    def data(self):
        return torch.Tensor.data.__get__(self)

    @data.setter
    def data(self, value):
        if not isinstance(value, NpuTensor):
            raise RuntimeError(
                f"testbed npu: cannot assign .data of an npu tensor from a {type(value).__name__} "
                f"on {getattr(value, 'device', '?')} (incompatible tensor type)"
            )
        torch.Tensor.data.__set__(self, value)
        self.elem = value.elem

    def __repr__(self, *, tensor_contents=None):
        body = torch._tensor_str._str(self.elem.detach())
        dev = f", device='{self.device}'"
        cut = len(body) - 1
        for marker in (", size=", ", dtype=", ", requires_grad", ", grad_fn"):
            pos = body.find(marker)
            if pos != -1:
                cut = min(cut, pos)
        out = body[:cut] + dev + body[cut:]
        if self.grad_fn is not None:
            out = out[:-1] + f", grad_fn=<{type(self.grad_fn).__name__}>)"
        elif self.requires_grad:
            out = out[:-1] + ", requires_grad=True)"
        return out

    def __format__(self, spec):
        if self.dim() == 0:
            return self.item().__format__(spec)
        return object.__format__(self, spec)

    def __deepcopy__(self, memo):
        if id(self) in memo:
            return memo[id(self)]
        new = NpuTensor(copy.deepcopy(self.elem, memo), self.device.index, self.requires_grad)
        for k, v in self.__dict__.items():
            if k != "elem":
                setattr(new, k, copy.deepcopy(v, memo))
        memo[id(self)] = new
        return new

    def __reduce_ex__(self, proto):
        # Pickles as "an npu tensor with this CPU content"; loading needs the
        # simulated device active (as loading npu tensors needs torch_npu).
        return (_rebuild, (self.elem, self.device.index, self.requires_grad))


def _rebuild(elem, index, requires_grad):
    return NpuTensor(elem, index, requires_grad)


_SUBCLASSES: dict = {}  # a plain Tensor subclass -> its npu class (the subclass and NpuTensor)


def _as_subclass(self, cls):
    """``t.as_subclass(cls)`` of an npu tensor, for a plain (non-wrapper) Tensor subclass ``cls``.

    On a card an npu tensor is an ordinary ``torch.Tensor`` (torch_npu's PrivateUse1 is a C++
    backend), so ``as_subclass`` gives it any Python subclass: torch's default ``__torch_function__``
    does so for every result of an op on such a subclass (``torch._tensor._convert``), and
    ComfyUI-GGUF's ``GGMLTensor`` (weights that stay quantized on the card) lives on that. Here the
    npu tensor is already a Python object (this wrapper), which torch will not re-class: the bed
    answers with a wrapper of the same CPU data whose class is ``cls`` and this one (``cls``'s
    methods, this class's dispatch), as the card would.
    """
    if cls in _SUBCLASSES.values():
        cls = cls.__mro__[1]
    if isinstance(self, cls) or not issubclass(cls, torch.Tensor) or issubclass(cls, NpuTensor):
        return torch._C.TensorBase.as_subclass(self, cls)
    both = _SUBCLASSES.get(cls)
    if both is None:
        both = _SUBCLASSES[cls] = type(cls.__name__, (cls, NpuTensor),
                                       {"__module__": cls.__module__, "__qualname__": cls.__qualname__})
        # set after the class is made (torch's tensor metaclass replaces one given in the body)
        own = next(klass.__dict__["__torch_function__"] for klass in cls.__mro__
                   if "__torch_function__" in klass.__dict__)
        both.__torch_function__ = own if own is not torch.Tensor.__dict__["__torch_function__"] \
            else classmethod(_default_torch_function)
    return NpuTensor.__new__(both, self.elem, self.device.index, self.requires_grad)


def _default_torch_function(cls, func, types, args=(), kwargs=None):
    """torch's default ``Tensor.__torch_function__`` for the npu class of a plain subclass: the
    results of its ops are the subclass, on the card (npu results) or as torch makes them (CPU)."""
    user = cls.__mro__[1]
    if not all(issubclass(cls, t) or issubclass(user, t) for t in types):
        return NotImplemented
    with torch._C.DisableTorchFunctionSubclass():
        ret = func(*args, **(kwargs or {}))
        if func in torch.overrides.get_default_nowrap_functions():
            return ret

        def convert(value):
            if isinstance(value, torch.Tensor) and not isinstance(value, user):
                return _as_subclass(value, user) if isinstance(value, NpuTensor) \
                    else torch._C.TensorBase.as_subclass(value, user)
            if isinstance(value, (tuple, list)):
                return type(value)(convert(v) for v in value)
            return value

        return convert(ret)


NpuTensor.as_subclass = _as_subclass


# --------------------------------------------------------------------------- helpers


def wrap(t: torch.Tensor, index: int | None = None) -> NpuTensor:
    """An npu tensor sharing storage with CPU tensor ``t`` (no copy)."""
    idx = current_device() if index is None else index
    _check_index(idx)
    return NpuTensor(t, idx)


def unwrap(t):
    """The CPU tensor behind an npu tensor (shares storage); other values as-is."""
    return t.elem if isinstance(t, NpuTensor) else t


def is_npu_tensor(t) -> bool:
    return isinstance(t, NpuTensor)


def storage_ptr(t: torch.Tensor) -> int:
    """data_ptr of the underlying CPU storage of an npu or CPU tensor."""
    return unwrap(t).untyped_storage().data_ptr()


def shares_storage(a: torch.Tensor, b: torch.Tensor) -> bool:
    """True when two (npu or CPU) tensors view the same underlying storage."""
    sa, sb = unwrap(a).untyped_storage(), unwrap(b).untyped_storage()
    pa, pb = sa.data_ptr(), sb.data_ptr()
    if pa == 0 or pb == 0:  # empty storages all have ptr 0
        return sa._cdata == sb._cdata
    return pa == pb


def _track(elem: torch.Tensor, index: int) -> None:
    try:
        st = elem.untyped_storage()
    except Exception:
        return
    key = st._cdata
    if key in _live:
        return
    nbytes = st.nbytes()
    if not nbytes:
        return
    with _lock:
        _live[key] = (index, nbytes)
        _allocated[index] += nbytes
        if _allocated[index] > _peak[index]:
            _peak[index] = _allocated[index]
    weakref.finalize(st, _untrack, key)


def _untrack(key) -> None:
    with _lock:
        entry = _live.pop(key, None)
        if entry is not None:
            _allocated[entry[0]] -= entry[1]


def memory_allocated(device=None) -> int:
    """Bytes of CPU storage currently held by live npu tensors on ``device``."""
    return _allocated[_index_of(device)]


def max_memory_allocated(device=None) -> int:
    return _peak[_index_of(device)]


def reset_peak_memory_stats(device=None) -> None:
    idx = _index_of(device)
    _peak[idx] = _allocated[idx]


# --------------------------------------------------------------------------- CPU fallback


def cpu_fallback_ops() -> frozenset:
    """Ops that fall back whatever the registry says (``aten::_int_mm`` on the device alone)."""
    return frozenset(_fallback_ops)


def set_cpu_fallback_ops(ops) -> frozenset:
    """Replace the set of aten ops forced to 'have no NPU kernel'; returns the old set.

    Without a registry (the device alone) these are the only fallbacks; with one
    (torch_npu imported) they fall back on top of the ops the registry lacks."""
    old = frozenset(_fallback_ops)
    _fallback_ops.clear()
    _fallback_ops.update(ops)
    return old


def install_registry(reg) -> int:
    """Judge every aten op as torch_npu ``reg`` (an ``npu_registry.Registry``) does; returns how
    many PrivateUse1 kernels the bed registered for it.

    Like the real package's import, this registers a PrivateUse1 kernel for each overload the
    wheel registers, so ``torch._C._dispatch_has_kernel_for_dispatch_key("aten::X", "PrivateUse1")``
    answers as on a card. Each kernel is the simulation (the op runs on the CPU data). Overloads
    that already have one (the bed's factories, the fake's SDPA) keep theirs. Once per process.
    """
    global _registry
    with _lock:
        if _registry is not None:
            if _registry.folder != reg.folder:
                raise RuntimeError("this process already models the torch_npu registry in %s" % _registry.folder)
            return len(_registry_kernels)
        lib = torch.library.Library("aten", "IMPL")
        for name in sorted(reg.kernels):
            if torch._C._dispatch_has_kernel_for_dispatch_key(name, "PrivateUse1"):
                continue
            short = name.split("::", 1)[1]
            lib.impl(short, _registry_kernel(name), "PrivateUse1")
            _registry_kernels[name] = "aten/%s/PrivateUse1" % short
        # torch.library lists Python registrations so that a second one raises (torch 2.12) and
        # _has_foreign_name can tell an override; torch_npu's are C++, listed nowhere
        torch.library._impls.difference_update(lib._op_impls)
        lib._op_impls.clear()
        _libs.append(lib)
        _verdicts.clear()
        _registry = reg
        return len(_registry_kernels)


def registry():
    """The ``npu_registry.Registry`` this machine judges by (None: the device alone)."""
    return _registry


def _registry_kernel(name: str):
    overload = []

    def kernel(*args, **kwargs):
        # reached for factories (no npu tensor in: BackendSelect picks PrivateUse1) and below
        # the Python key; npu tensors arrive in NpuTensor.__torch_dispatch__ first
        if not overload:
            base, _, overload_name = name.split("::", 1)[1].partition(".")
            overload.append(getattr(getattr(torch.ops.aten, base), overload_name or "default"))
        for value in tree_flatten((args, kwargs))[0]:
            if isinstance(value, torch.Tensor) and not isinstance(value, NpuTensor) and value.device.type == DEVICE_TYPE:
                raise RuntimeError(
                    "testbed: %s got an npu tensor that is no NpuTensor: a composite kernel run on the "
                    "wrappers made an alias of one in C++; run that composite whole (_ALIASING_COMPOSITES)" % name)
        return _dispatch(overload[0], args, kwargs)

    kernel.__name__ = kernel.__qualname__ = "testbed_npu_kernel"
    return kernel


def dtype_findings() -> collections.Counter:
    """Counter of ``(label, dtype)`` calls outside torch_npu's documented dtype table
    (testbed/dtype_table.py) since the last reset; results are never changed for them."""
    with _lock:
        return collections.Counter(_dtype_findings)


def reset_dtype_findings() -> None:
    with _lock:
        _dtype_findings.clear()


def cpu_fallbacks() -> collections.Counter:
    """Counter of op names that fell back to the CPU since the last reset."""
    return collections.Counter(_fallback_log)


def reset_cpu_fallbacks() -> None:
    _fallback_log.clear()
    _fallback_warned.clear()


def op_counts() -> collections.Counter:
    """Counter of aten op names dispatched on npu tensors (when counting is on).

    A composite op without an NPU kernel of its own is counted as the ops it
    decomposes into, as a PrivateUse1 backend runs it (while counting, the bed
    runs it that way too)."""
    return collections.Counter(_op_counts)


def op_counts_by_device() -> collections.Counter:
    """Like op_counts, keyed ``(npu index, op name)`` (index None: no npu tensor argument)."""
    return collections.Counter(_op_counts_by_device)


def _first_npu_index(args, kwargs):
    """The card an op runs on: its first npu tensor's, else (a factory the bed's registered kernel
    serves) its ``device=``, else this thread's current card, as on a real card."""
    for a in tree_flatten((args, kwargs))[0]:
        if isinstance(a, NpuTensor):
            return a.device.index
    target = (kwargs or {}).get("device")
    if isinstance(target, torch.device) and target.type == DEVICE_TYPE and target.index is not None:
        return target.index
    return current_device()


def reset_op_counts(enable: bool | None = None) -> None:
    """Clear the op counter; ``enable`` switches counting on/off (off by default)."""
    global _count_ops
    _op_counts.clear()
    _op_counts_by_device.clear()
    if enable is not None:
        _count_ops = bool(enable)


def _strtol(text: str | None) -> int | None:
    """C's strtol(text, nullptr, 10) as torch_npu reads its options; None when unset."""
    if text is None:
        return None
    match = re.match(r"\s*([+-]?\d+)", text)
    return int(match.group(1)) if match else 0


def _native_warning_printed() -> bool:
    """Whether torch_npu's TORCH_NPU_WARN reaches stderr in this process.

    torch_npu's OptionsManager::ShouldPrintWarning: TORCH_NPU_WARNING_DISABLE
    (else TORCH_NPU_DISABLED_WARNING) equal to 1 silences it, and only rank 0
    or no RANK prints; c10's logger then drops it below TORCH_CPP_LOG_LEVEL.
    """
    disabled = os.environ.get("TORCH_NPU_WARNING_DISABLE")
    if disabled is None:
        disabled = os.environ.get("TORCH_NPU_DISABLED_WARNING")
    if _strtol(disabled) == 1:
        return False
    rank = _strtol(os.environ.get("RANK"))
    if rank not in (None, 0, -1):
        return False
    level = os.environ.get("TORCH_CPP_LOG_LEVEL", "").upper()
    return level not in ("2", "ERROR", "3", "FATAL")


def _native_warn(message: str, function: str, file: str, line: int) -> None:
    """What torch_npu's ``warn_`` does: not a Python warning but c10's base
    WarningHandler, i.e. one c10 log line written by C++ straight to fd 2
    (Python's warning filters, logging.captureWarnings and sys.stderr never see it)."""
    if not _native_warning_printed():
        return
    now = time.time_ns()
    tm = time.localtime(now // 1_000_000_000)
    text = "[W%d %02d:%02d:%02d.%09d %s:%d] Warning: %s (function %s)\n" % (
        tm.tm_mon * 100 + tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, now % 1_000_000_000,
        file, line, message, function)
    try:
        os.write(2, text.encode())
    except OSError:
        pass


def _cpu_fallback(name: str) -> None:
    if os.environ.get("TORCH_NPU_FALLBACK_CPU_DISABLE", "") not in ("", "0"):
        raise RuntimeError(
            f"The operator '{name}' is not currently supported on the NPU backend, and CPU "
            f"fallback is disabled (TORCH_NPU_FALLBACK_CPU_DISABLE=1)."
        )
    with _lock:
        _fallback_log[name] += 1
        first = name not in _fallback_warned
        _fallback_warned.add(name)
    if first:
        # torch_npu's npu_cpu_fallback: TORCH_NPU_WARN once per op name
        _native_warn(
            f"CAUTION: The operator '{name}' is not currently supported on the NPU backend and will "
            f"fall back to run on the CPU. This may have performance implications.",
            "npu_cpu_fallback", "VariableFallbackKernel.cpp", 250,
        )


# --------------------------------------------------------------------------- dispatch


def _sync_metadata(w: NpuTensor) -> None:
    """After an in-place/out= op changed elem's geometry (t_, resize_, set_), mirror it."""
    e = w.elem
    if w.size() == e.size() and w.stride() == e.stride() and w.storage_offset() == e.storage_offset():
        return
    # Like torch's return_and_correct_aliasing: run set_ on the wrapper with the
    # Meta key, so only its metadata changes.  The storage comes from a fresh
    # data-less wrapper of the new geometry, so growth (out= resize) works too.
    fresh = torch.Tensor._make_wrapper_subclass(
        NpuTensor, e.size(), strides=e.stride(), storage_offset=e.storage_offset(), dtype=e.dtype, device=w.device
    )
    storage = torch.Tensor.untyped_storage(fresh)
    with no_dispatch():
        prev = torch._C._meta_in_tls_dispatch_include()
        torch._C._set_meta_in_tls_dispatch_include(True)
        try:
            torch.ops.aten.set_.source_Storage_storage_offset(w, storage, e.storage_offset(), e.size(), e.stride())
        finally:
            torch._C._set_meta_in_tls_dispatch_include(prev)


_namespace_handlers: dict = {}  # op namespace -> handler(func, args, kwargs) (NotImplemented: not its op)


def set_namespace_handler(namespace: str, handler) -> None:
    """Let ``handler(func, args, kwargs)`` run the ``namespace`` ops that reach an npu tensor
    (None removes it). It returns the op's result, or NotImplemented to leave the op to its
    own kernel below the Python key, as any other non-aten op."""
    with _lock:
        if handler is None:
            _namespace_handlers.pop(namespace, None)
        else:
            _namespace_handlers[namespace] = handler


def _dispatch(func, args, kwargs):
    schema_name = func._schema.name
    if func.namespace not in _ATEN_NAMESPACES:
        handler = _namespace_handlers.get(func.namespace)
        if handler is not None:
            out = handler(func, args, kwargs)
            if out is not NotImplemented:
                return out
        return _redispatch_custom(func, args, kwargs)
    verdict, detail = _verdict(func)
    foreign = _has_foreign_kernel(func)
    watched = schema_name in _dtype_table.WATCHED and not getattr(_watching, "depth", 0)
    if watched:
        found = _dtype_table.finding(schema_name, args, kwargs)
        if found is not None:
            with _lock:
                _dtype_findings[found] += 1
    if not foreign and (verdict == _reg.DECOMPOSE or (_count_ops and _runs_as_decomposition(func))):
        # a CompositeImplicitAutograd op without an NPU kernel reaches the backend whole when
        # autograd is below (inference_mode, a custom op's body); the backend runs its
        # decomposition, and each piece is judged (and counted) on its own
        out = _watched_pieces(watched, lambda: func.decompose(*args, **(kwargs or {})))
        if out is not NotImplemented:
            return out
    if _count_ops and not (verdict == _reg.COMPOSITE and not func.is_view and schema_name not in _ALIASING_COMPOSITES):
        _op_counts[schema_name] += 1
        _op_counts_by_device[(_first_npu_index(args, kwargs), schema_name)] += 1
    if schema_name in _NO_OP:
        return None

    flat, _ = tree_flatten((args, kwargs))
    transfer = schema_name in _TRANSFER_OPS
    allowed_cpu = set()
    if schema_name in _INDEX_OPS and len(args) > 1 and isinstance(args[1], (list, tuple)):
        allowed_cpu = {id(i) for i in args[1] if isinstance(i, torch.Tensor)}

    npu_index = None
    first_dev = None
    inputs = {}  # id(CPU tensor handed to the op) -> the caller's tensor
    for a in flat:
        if not isinstance(a, torch.Tensor):
            continue
        if isinstance(a, NpuTensor):
            inputs[id(a.elem)] = a
            if npu_index is None:
                npu_index = a.device.index
            dev = str(a.device)
        else:
            inputs[id(a)] = a
            # 0-dim CPU tensors act as scalars, as on CUDA.
            if id(a) in allowed_cpu or (a.device.type == "cpu" and a.dim() == 0):
                continue
            dev = str(a.device)
        if transfer:
            continue
        if first_dev is None:
            first_dev = dev
        elif dev != first_dev:
            raise RuntimeError(
                "Expected all tensors to be on the same device, but found at least two "
                f"devices, {first_dev} and {dev}!"
            )

    if foreign:
        # a PrivateUse1 kernel registered by someone else (torch_npu, the shim)
        # beats torch_npu's boxed CPU fallback, as in the real dispatcher
        return _redispatch_custom(func, args, kwargs)
    if schema_name in _fallback_ops or func.name() in _fallback_ops:
        _cpu_fallback(func.name())
    elif verdict == _reg.COMPOSITE and not func.is_view and schema_name not in _ALIASING_COMPOSITES:
        # its CompositeExplicitAutograd kernel runs on the card, calling ops that are judged
        # in turn (a view's kernel only makes views: it runs whole below)
        return _watched_pieces(watched, lambda: _redispatch_custom(func, args, kwargs))
    elif verdict in (_reg.STRUCTURED, _reg.FALLBACK) and detail != func.name() and _has_foreign_name(detail):
        # a structured op whose .out overload someone else serves: its NonFunctional wrapper
        # calls that overload on the card
        return _watched_pieces(watched, lambda: _redispatch_custom(func, args, kwargs))
    elif verdict == _reg.FALLBACK:
        # torch_npu's npu_cpu_fallback, named as the op that reached it (a structured op's
        # wrapper reaches it as its .out overload)
        _cpu_fallback(detail)

    def unwrap_arg(x):
        if isinstance(x, NpuTensor):
            return x.elem
        if isinstance(x, torch.device) and x.type == DEVICE_TYPE:
            return torch.device("cpu")
        return x

    cargs = tree_map(unwrap_arg, args)
    ckwargs = tree_map(unwrap_arg, kwargs)

    # Where results live: an explicit device= kwarg wins (e.g. _to_copy to cpu).
    target = kwargs.get("device")
    if target is None and schema_name == "aten::to":
        # aten::to.device takes it positionally; inside another subclass's
        # __torch_dispatch__ ``.cpu()``/``.to()`` arrive here undecomposed
        target = next((a for a in args if isinstance(a, torch.device)), None)
    to_host = isinstance(target, torch.device) and target.type != DEVICE_TYPE
    if isinstance(target, torch.device):
        if target.type == DEVICE_TYPE:
            out_index = current_device() if target.index is None else target.index
            _check_index(out_index)
        else:
            out_index = None
    else:
        out_index = npu_index

    if out_index is not None:
        slot = _generator_slot(func)
        if slot is not None:
            cargs, ckwargs = _npu_generator(slot, cargs, ckwargs, out_index)

    hf32 = _state["allow_hf32"] and schema_name in _MATMUL_OPS
    if hf32:
        cargs = tree_map(_to_hf32, cargs)
    out = func(*cargs, **ckwargs)
    if hf32:
        tree_map(_round_to_hf32_, out)  # in place: out= results keep their identity

    def wrap_out(o):
        if not isinstance(o, torch.Tensor) or isinstance(o, NpuTensor):
            return o
        same = inputs.get(id(o))
        if same is not None and to_host and isinstance(same, NpuTensor):
            return o.clone()  # the CPU op aliased its input; a transfer to the host copies
        if same is not None:  # in-place / out= op: hand back the caller's tensor
            if isinstance(same, NpuTensor):
                _sync_metadata(same)
            return same
        if out_index is not None and o.device.type == "cpu":
            if normal_in_inference and func.is_view:
                # A view of a normal tensor is a normal tensor even in inference
                # mode (autograd sets its version counter, which an inference
                # tensor refuses). Anything computed is an inference tensor, as
                # on a card: code that keys on version counters sees none.
                with torch.inference_mode(False):
                    return NpuTensor(o, out_index)
            return NpuTensor(o, out_index)
        return o

    normal_in_inference = torch.is_inference_mode_enabled() and any(
        isinstance(t, NpuTensor) and not t.is_inference() for t in inputs.values()
    )
    return tree_map(wrap_out, out)


def _runs_as_decomposition(func) -> bool:
    """A CompositeImplicitAutograd op with no PrivateUse1 kernel of its own."""
    name = func.name()
    return torch._C._dispatch_has_kernel_for_dispatch_key(name, "CompositeImplicitAutograd") and \
        not torch._C._dispatch_has_kernel_for_dispatch_key(name, "PrivateUse1")


def _has_foreign_kernel(func) -> bool:
    return _has_foreign_name(func.name())


def _has_foreign_name(name: str) -> bool:
    """Whether a PrivateUse1 kernel other than the bed's simulation serves ``name`` now."""
    if name in _BED_KERNELS:
        return False
    key = _registry_kernels.get(name)
    if key is not None:
        # the bed's kernel for a torch_npu op; torch.library lists it only once someone
        # else's Python registration overrides it (install_registry took the bed's own out)
        return key in torch.library._impls
    return torch._C._dispatch_has_kernel_for_dispatch_key(name, "PrivateUse1")


_NO_VERDICT = (None, None)


def _verdict(func) -> tuple:
    """``(verdict, detail)`` of an aten op by torch_npu's registry (npu_registry.Registry.verdict);
    ``(None, None)`` without a registry (the device alone: only ``cpu_fallback_ops()`` fall back)."""
    if _registry is None or func.namespace != "aten":
        return _NO_VERDICT
    found = _verdicts.get(func)
    if found is None:
        found = _verdicts[func] = _registry.verdict(func.name())
    return found


def _watched_pieces(watched: bool, run):
    """``run()``; the pieces of a watched op are not watched again (one finding per call)."""
    if not watched:
        return run()
    _watching.depth = getattr(_watching, "depth", 0) + 1
    try:
        return run()
    finally:
        _watching.depth -= 1


def _to_hf32(t):
    """fp32 values rounded (nearest-even) to HF32's 10 stored mantissa bits."""
    if not isinstance(t, torch.Tensor) or t.dtype != torch.float32:
        return t
    bits = t.contiguous().view(torch.int32)
    keep = ((bits >> _HF32_DROPPED_BITS) & 1) + ((1 << (_HF32_DROPPED_BITS - 1)) - 1)
    rounded = (bits + keep) & ~((1 << _HF32_DROPPED_BITS) - 1)
    return rounded.view(torch.float32).reshape(t.shape)


def _round_to_hf32_(t):
    if isinstance(t, torch.Tensor) and t.dtype == torch.float32:
        t.copy_(_to_hf32(t))
    return t


def float8_storage() -> bool:
    """Whether the simulated SoC holds float8 tensors (Ascend 950 does, A2/A3 do not)."""
    return _state["float8"]


def set_float8_storage(enabled: bool) -> bool:
    """Let npu tensors be float8 or not; returns the previous setting."""
    previous = _state["float8"]
    _state["float8"] = bool(enabled)
    return previous


def _refuse_float8(dtype) -> None:
    # Every npu tensor is made here (factories, copies, op results), so a
    # float8 one fails where torch_npu's dtype conversion fails on a 910B:
    # "Float8_e4m3fn has not been supported" (ConvertToAclDataType).
    if dtype.is_floating_point and dtype.itemsize == 1 and not _state["float8"]:
        name = str(dtype).removeprefix("torch.")
        raise RuntimeError(f"{name[:1].upper()}{name[1:]} has not been supported")


def matmul_allow_hf32() -> bool:
    return _state["allow_hf32"]


def set_matmul_allow_hf32(enabled: bool) -> None:
    """``torch.npu.matmul.allow_hf32``: fp32 GEMMs on the device lose precision."""
    _state["allow_hf32"] = bool(enabled)


def _redispatch_custom(func, args, kwargs):
    """Run a non-aten op's own kernel (usually a Python body) on the wrappers."""
    ks = None
    for a in tree_flatten((args, kwargs))[0]:
        if isinstance(a, torch.Tensor):
            k = torch._C._dispatch_keys(a)
            ks = k if ks is None else ks | k
    if ks is None:
        return func(*args, **kwargs)
    return func.redispatch(ks & _AFTER_PYTHON, *args, **kwargs)


# --------------------------------------------------------------------------- backend kernels


def _factory_index(device) -> int:
    idx = _index_of(device) if device is not None else current_device()
    _check_index(idx)
    return idx


def _k_empty(size, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    idx = _factory_index(device)
    t = torch.empty(size, dtype=dtype, memory_format=memory_format or torch.contiguous_format)
    return NpuTensor(t, idx)


def _k_empty_strided(size, stride, dtype=None, layout=None, device=None, pin_memory=None):
    idx = _factory_index(device)
    return NpuTensor(torch.empty_strided(size, stride, dtype=dtype), idx)


def _k_copy_from(self, dst, non_blocking=False):
    unwrap(dst).copy_(unwrap(self))
    return dst


def _k_copy_from_and_resize(self, dst):
    d = unwrap(dst)
    d.resize_(unwrap(self).size())
    d.copy_(unwrap(self))
    if isinstance(dst, NpuTensor):
        _sync_metadata(dst)
    return dst


def _k_local_scalar_dense(self):
    return unwrap(self).item()


# Pinned host memory: torch asks the accelerator's hooks for a pinned allocator,
# which a Python backend cannot provide.  CPU kernels for _pin_memory/is_pinned
# (these ops only have composite kernels, so nothing is overridden) make
# ``t.pin_memory()`` return a copy that ``is_pinned()`` recognises, as on a box
# with torch_npu.
_pinned: set = set()


def _k_pin_memory(self, device=None):
    out = torch.empty_like(self, memory_format=torch.contiguous_format)
    out.copy_(self)
    st = out.untyped_storage()
    key = st._cdata
    _pinned.add(key)
    weakref.finalize(st, _pinned.discard, key)
    return out


def _k_is_pinned(self, device=None):
    return self.untyped_storage()._cdata in _pinned


class _DeviceGuard(torch._C._acc.DeviceGuard):
    def type_(self):
        return torch._C._autograd.DeviceType.PrivateUse1


class _Hooks(torch._C._acc.PrivateUse1Hooks):
    def is_available(self) -> bool:
        return _state["count"] > 0

    def has_primary_context(self, dev_id) -> bool:
        return True

    def is_built(self) -> bool:
        return True


class _Generator(torch._C.Generator):
    """``torch.Generator`` that also takes ``device="npu"``, as with torch_npu.

    torch_npu registers an NPU generator in C++ (its PrivateUse1 hooks'
    ``getNewGenerator``); Python hooks cannot, so the bed hands out a CPU
    generator that reports the npu device. Random ops on npu tensors run on
    their CPU data in ``_dispatch``, where a CPU generator is what the kernel
    takes. ComfyUI and comfy-kitchen create one per device for stochastic
    rounding (a LoRA patched into int8 / fp8 weights); ComfyUI's ancestral/SDE
    samplers draw their noise with one. What the bed cannot tell: a real NPU
    generator is Philox (its sequences differ from the CPU's mt19937, and its
    state is not the CPU's 5056 bytes), and a CPU op given an NPU generator
    would be refused on a card but runs here.
    """

    def __new__(cls, device=None):
        target = torch.device(device) if isinstance(device, (str, int)) else device
        if target is not None and target.type == DEVICE_TYPE:
            index = _index_of(target)
            _check_index(index)
            gen = super().__new__(cls, device="cpu")
            gen._npu_index = index
            # a generator reaches a kernel as a new Python object around the same C++
            # generator: known by that generator's address while this object lives
            key = gen._cdata
            _npu_generators[key] = index
            weakref.finalize(gen, _npu_generators.pop, key, None)
            return gen
        return super().__new__(cls) if device is None else super().__new__(cls, device=device)

    @property
    def device(self) -> torch.device:
        index = getattr(self, "_npu_index", None)
        return super().device if index is None else torch.device(DEVICE_TYPE, index)


_default_generators: dict = {}
_npu_generators: dict = {}  # C++ generator address -> card index, for each live npu generator
_generator_slots: dict = {}  # OpOverload -> (position, name, kwarg_only) of its Generator? argument, or None


def default_generator(index: int | None = None) -> "_Generator":
    """The default NPU generator of card ``index`` (``torch.npu.default_generators[index]``):
    random ops on that card's tensors draw from it unless given another, never from the CPU's."""
    idx = current_device() if index is None else int(index)
    _check_index(idx)
    with _lock:
        gen = _default_generators.get(idx)
        if gen is None:
            gen = _default_generators[idx] = _Generator(device=torch.device(DEVICE_TYPE, idx))
        return gen


def _generator_slot(func):
    if func in _generator_slots:
        return _generator_slots[func]
    slot = None
    for position, argument in enumerate(func._schema.arguments):
        if isinstance(argument.type, torch._C.OptionalType) and isinstance(
                argument.type.getElementType(), torch._C._GeneratorType):
            slot = (position, argument.name, argument.kwarg_only)
            break
    _generator_slots[func] = slot
    return slot


def _npu_generator(slot, args, kwargs, index):
    """The op's generator, as the NPU kernel takes it: the card's default one for None; a
    generator of another device type is refused as torch_npu's check_generator refuses it."""
    position, name, kwarg_only = slot
    positional = not kwarg_only and len(args) > position
    gen = args[position] if positional else kwargs.get(name)
    if gen is None:
        gen = default_generator(index)
    elif gen._cdata not in _npu_generators:
        raise RuntimeError("Expected a '%s' device type for generator but found '%s'" % (DEVICE_TYPE, gen.device.type))
    if positional:
        args = (*args[:position], gen, *args[position + 1:])
    else:
        kwargs = {**kwargs, name: gen}
    return args, kwargs


def _minimal_module() -> types.ModuleType:
    """torch.npu before torch_npu supplies the full one (tests of the device alone)."""
    m = types.ModuleType("torch.npu")
    m.is_available = lambda: _state["count"] > 0
    m.device_count = device_count
    m.current_device = current_device
    m.set_device = set_device
    m.is_initialized = lambda: True
    m._is_in_bad_fork = lambda: False
    m.manual_seed_all = lambda seed: [default_generator(i).manual_seed(seed) for i in range(_state["count"])]
    m.manual_seed = lambda seed: default_generator().manual_seed(seed)
    m.synchronize = lambda device=None: None
    m.get_amp_supported_dtype = lambda: [torch.float16, torch.bfloat16]
    return m


_libs: list = []


def activate(backend_module: types.ModuleType | None = None, count: int | None = None):
    """Install the npu device (idempotent) and return the ``torch.npu`` module.

    ``backend_module`` (the fake torch_npu's runtime module) replaces the
    minimal ``torch.npu`` if given, also after an earlier activation.
    """
    global _AFTER_PYTHON
    with _lock:
        if count is not None:
            set_device_count(count)
        if not _state["active"]:
            existing = torch._C._get_privateuse1_backend_name()
            if existing not in ("privateuseone", DEVICE_TYPE):
                raise RuntimeError(f"PrivateUse1 is already renamed to {existing!r}")
            if hasattr(torch, DEVICE_TYPE) and existing == DEVICE_TYPE:
                raise RuntimeError("an npu backend is already registered (real torch_npu loaded?)")
            module = backend_module or _minimal_module()
            torch.utils.backend_registration._setup_privateuseone_for_python_backend(
                rename=DEVICE_TYPE,
                backend_module=module,
                hook=_Hooks(),
                device_guard=_DeviceGuard(),
            )
            lib = torch.library.Library("aten", "IMPL")
            lib.impl("empty.memory_format", _k_empty, "PrivateUse1")
            lib.impl("empty_strided", _k_empty_strided, "PrivateUse1")
            lib.impl("_copy_from", _k_copy_from, "PrivateUse1")
            lib.impl("_copy_from_and_resize", _k_copy_from_and_resize, "PrivateUse1")
            lib.impl("_local_scalar_dense", _k_local_scalar_dense, "PrivateUse1")
            lib.impl("_pin_memory", _k_pin_memory, "CPU")
            lib.impl("is_pinned", _k_is_pinned, "CPU")
            _libs.append(lib)
            # torch_npu registers autocast kernels in C++; here autocast("npu")
            # is accepted but casts nothing.
            fallback = torch.library.Library("_", "IMPL")
            fallback.fallback(torch.library.fallthrough_kernel, dispatch_key="AutocastPrivateUse1")
            _libs.append(fallback)
            _AFTER_PYTHON = torch._C._dispatch_keyset_full_after(torch._C.DispatchKey.Python)
            torch.Generator = _Generator
            # torch.load(weights_only=True), the default, may rebuild npu tensors.
            torch.serialization.add_safe_globals([_rebuild])
            _state["module"] = module
            _state["active"] = True
        elif backend_module is not None and backend_module is not _state["module"]:
            import sys

            setattr(torch, DEVICE_TYPE, backend_module)
            sys.modules[f"torch.{DEVICE_TYPE}"] = backend_module
            _state["module"] = backend_module
        return _state["module"]
