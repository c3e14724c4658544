"""comfy-kitchen's RoPE family on ``npu_rotary_mul`` / ``npu_rms_norm``: backend ``ascend_shim_rope``.

comfy-kitchen before 0.2.36 has no NPU implementation of ``apply_rope*`` /
``rms_rope*``; eager then runs each RoPE as several elementwise kernels
through fp32 copies. This backend serves the NPU calls the fused ops take:

* the rotation in ``freqs_cis``'s dtype, as eager computes it (x is cast to
  it and back, one rounding to x's dtype, as eager's), with the rotary
  coefficients built once per call and kept per ``freqs_cis`` tensor where
  its version counter shows changes (``CoefficientCache``);
* the norm of ``rms_rope*`` on ``npu_rms_norm`` where the scale has x's dtype.

A call outside the ops' documented limits (``rope_contract.decline``) goes on
down the priority list to eager, on the device. Both ops are checked once per
device by a small call whose answer is known (``rope_contract.Probe``); one
that fails is not used.
Coexistence with upstream's ``ascend`` (0.2.36+) follows ``ASCEND_SHIM_INT8``:
``auto`` puts this backend right after ``ascend`` (it takes what upstream
declines), ``shim`` before it, ``upstream``/``off`` register nothing.
"""

from __future__ import annotations

import collections
import functools
import inspect
import logging
import threading
import weakref

import torch

from ascend_shim.engine.npu import is_out_of_memory
from ascend_shim.kitchen import registry_access
from ascend_shim.kitchen.rope_contract import FLOATS, FUNCTIONS, Probe, decline, trim_length
from ascend_shim.npu_math import rope as rope_math

log = logging.getLogger("ascend_shim")

BACKEND = "ascend_shim_rope"
UPSTREAM = "ascend"
EAGER = "eager"
MAX_CACHE = 8
# what the ops raise for an input they refuse (NotImplementedError is a RuntimeError)
OP_ERRORS = (RuntimeError, TypeError, ValueError)


class Counters:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.reset()

    def reset(self) -> None:
        self.fused: collections.Counter = collections.Counter()
        self.to_eager: collections.Counter = collections.Counter()
        self.declined: dict = {}
        self.coefficients_built = 0
        self.coefficients_reused = 0

    def decline(self, reason: str) -> None:
        with self._lock:
            self.declined[reason] = self.declined.get(reason, 0) + 1

    def as_dict(self) -> dict:
        with self._lock:
            return {"fused": dict(self.fused), "to_eager": dict(self.to_eager),
                    "declined": dict(self.declined), "coefficients_built": self.coefficients_built,
                    "coefficients_reused": self.coefficients_reused}


COUNTERS = Counters()


class CoefficientCache:
    """``(r1, r2)`` per ``freqs_cis`` tensor and layout, built once.

    Keyed on the tensor's identity, checked against a weak reference (a
    freed tensor's entry goes with it, a new tensor at the same address is
    not served) and its version counter (an in-place change rebuilds).
    Inference tensors keep no version counter: they are never cached (a
    call builds them once for all its tensors, ``RopeBackend.fused``).
    """

    def __init__(self, size: int = MAX_CACHE) -> None:
        self._entries: collections.OrderedDict = collections.OrderedDict()
        self._size = size
        self._lock = threading.Lock()
        self._signs: dict = {}  # (device, dtype) -> the (-1, 1) the build multiplies by

    def get(self, freqs: torch.Tensor, split_half: bool) -> tuple:
        try:
            version = freqs._version
        except RuntimeError:  # an inference tensor: changes cannot be seen
            return self._build(freqs, split_half)
        key = (id(freqs), split_half)
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None and entry[0]() is freqs and entry[1] == version:
                self._entries.move_to_end(key)
                COUNTERS.coefficients_reused += 1
                return entry[2]
        built = self._build(freqs, split_half)
        ref = weakref.ref(freqs, functools.partial(self._forget, key))
        with self._lock:
            self._entries[key] = (ref, version, built)
            self._entries.move_to_end(key)
            while len(self._entries) > self._size:
                self._entries.popitem(last=False)
        return built

    def _build(self, freqs, split_half):
        COUNTERS.coefficients_built += 1
        key = (str(freqs.device), freqs.dtype)
        sign = self._signs.get(key)
        if sign is None:  # our own constant, never handed out: made once per device and dtype
            sign = self._signs.setdefault(key, torch.tensor((-1.0, 1.0), dtype=freqs.dtype, device=freqs.device))
        return rope_math.rotary_coefficients(freqs, split_half, sign)

    def _forget(self, key, ref) -> None:
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None and entry[0] is ref:
                del self._entries[key]

    def __len__(self) -> int:
        return len(self._entries)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self._signs.clear()


CACHE = CoefficientCache()

# -- the fused path -------------------------------------------------------------

def rotate(ops, x: torch.Tensor, freqs: torch.Tensor, coefficients: tuple, split: bool, trims: bool) -> torch.Tensor:
    r1, r2 = coefficients
    trim = trim_length(x, freqs, split, trims)
    if trim is not None:
        r1, r2 = r1[:, :, :trim], r2[:, :, :trim]
    work = x.to(freqs.dtype).contiguous()  # eager rotates in freqs_cis's dtype
    return ops.npu_rotary_mul(work, r1, r2, rope_math.mode(split)).to(x.dtype)


def rms_rotate(ops, x, freqs, coefficients, scale, eps, split, trims, rot_dim=0):
    """The normalized, rotated x: one tensor, or ``(rotated, rest)`` when only the first
    ``rot_dim`` channels turn (joined by ``join``)."""
    normalized = ops.npu_rms_norm(x.contiguous(), scale, float(eps))[0]
    if rot_dim and rot_dim != x.shape[-1]:
        return rotate(ops, normalized[..., :rot_dim], freqs, coefficients, split, trims), normalized[..., rot_dim:]
    return rotate(ops, normalized, freqs, coefficients, split, trims)


def join(out, into=None):
    """A result of ``rms_rotate``/``rotate`` as one tensor, or written into ``into``
    (a partial one as two copies: no joined tensor made only to be copied)."""
    if into is None:
        return torch.cat(out, dim=-1) if isinstance(out, tuple) else out
    if isinstance(out, tuple):
        rotated, rest = out
        into[..., :rotated.shape[-1]].copy_(rotated)
        into[..., rotated.shape[-1]:].copy_(rest)
    else:
        into.copy_(out)
    return into


class RopeBackend:
    """The entry points of ``ascend_shim_rope`` for one comfy-kitchen and torch_npu."""

    def __init__(self, ops, registry, call_rules: bool, check_inplace, trims: bool) -> None:
        self.ops = ops
        self.trims = trims  # eager trims a longer interleaved freqs_cis (0.2.26+)
        self.registry = registry  # registry_access.KitchenRegistry
        self.call_rules = call_rules
        self.check_inplace = check_inplace
        self.probe = Probe(ops)
        self._signatures: dict = {}
        self._reported: set = set()

    def bind(self, function: str, args, kwargs) -> dict:
        """The call as keywords of eager's signature, defaults filled in."""
        signature = self._signatures.get(function)
        if signature is None:
            eager = self.registry.implementation(function, EAGER)
            signature = self._signatures[function] = inspect.signature(eager)
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        return dict(bound.arguments)

    def rule(self, function: str):
        def check(kwargs):
            from comfy_kitchen.constraints import ValidationResult

            try:
                reason = decline(function, dict(kwargs), self.probe, self.trims)
            except Exception as exc:  # a rule must never raise
                reason = "%s: %s" % (type(exc).__name__, exc)
            if reason:
                COUNTERS.decline(reason)
                return ValidationResult.fail("__rope__", reason)
            return ValidationResult.ok()
        return check

    def entry(self, function: str):
        def serve(*args, **kwargs):
            try:
                call = self.bind(function, args, kwargs)
            except TypeError:
                return self.to_eager(function, args, kwargs)
            if not self.call_rules:  # before kitchen 0.2.23 the entry decides
                reason = decline(function, call, self.probe, self.trims)
                if reason:
                    COUNTERS.decline(reason)
                    return self.to_eager(function, args, kwargs)
            return self.fused(function, call)
        serve.__name__ = function
        return serve

    def to_eager(self, function, args, kwargs):
        COUNTERS.to_eager[function] += 1
        return self.registry.implementation(function, EAGER)(*args, **kwargs)

    def fused(self, function: str, call: dict):
        xs, rms, split, inplace = FUNCTIONS[function]
        tensors = [call[n] for n in xs]
        freqs = call["freqs_cis"]
        if rms:
            scales = [call["scale"]] if len(xs) == 1 else [call["q_scale"], call.get("k_scale")]
            if len(scales) == 2 and scales[1] is None:
                scales[1] = scales[0]
        if inplace:  # eager's own checks, eager's errors
            self.check_inplace(*tensors, readonly=tuple([freqs] + (scales if rms else [])))
        try:
            coefficients = CACHE.get(freqs, split)  # once for the call's q and k
            if rms:
                outs = [rms_rotate(self.ops, x, freqs, coefficients, s, call["epsilon"], split, self.trims,
                                   call.get("rot_dim", 0)) for x, s in zip(tensors, scales)]
            else:
                outs = [rotate(self.ops, x, freqs, coefficients, split, self.trims) for x in tensors]
        except OP_ERRORS as exc:
            if is_out_of_memory(exc):
                raise
            # an input the checks let through and the op refused: eager serves it, on the device
            self.report_once("npu_rotary_mul/npu_rms_norm refused a %s call, served by eager: %s: %s"
                             % (function, type(exc).__name__, exc))
            return self.to_eager(function, (), call)
        COUNTERS.fused[function] += 1
        # written only once every op has run: a refusal above leaves the inputs as they were
        results = [join(out, x if inplace else None) for x, out in zip(tensors, outs)]
        return results[0] if len(results) == 1 else tuple(results)

    def report_once(self, message: str) -> None:
        if message not in self._reported:
            self._reported.add(message)
            log.warning(message)


# -- registration ----------------------------------------------------------------

def _constraints(backend: RopeBackend, function: str):
    """No more than eager declares (its dtypes and shape rules: eager refuses the rest with its
    own error, and before kitchen 0.2.23 a declined call goes straight to eager's function);
    the x-like tensors on the NPU, the others device-checked by the rule (eager answers a
    mixed-device call)."""
    from comfy_kitchen.constraints import FunctionConstraints, ParamConstraint

    xs = FUNCTIONS[function][0]
    eager = backend.registry.constraints(EAGER, function)
    eager_params = eager.params if eager is not None else {}
    params = {}
    for name in set(eager_params) | set(xs) | {"freqs_cis"}:
        theirs = eager_params.get(name)
        dtypes = FLOATS if theirs is None or theirs.dtypes is None else FLOATS & frozenset(theirs.dtypes)
        if name not in xs and name != "freqs_cis" and theirs is not None:
            dtypes = theirs.dtypes  # scales: eager's (the rule asks for x's dtype)
        params[name] = ParamConstraint(dtypes=dtypes, shape_rules=tuple(theirs.shape_rules) if theirs else (),
                                       devices=None if name in xs else frozenset({"*"}))
    extra = {"call_rules": (backend.rule(function),)} if backend.call_rules else {}
    return FunctionConstraints(params=params, default_devices=frozenset({"npu"}), **extra)


def install(ck, registry, policy: str) -> str:
    """Register ``ascend_shim_rope`` for the RoPE functions this kitchen has; returns a note.

    Nothing for policies ``upstream``/``off`` or a torch_npu without ``npu_rotary_mul``.
    Never raises: the INT8 backends registered before it stay.
    """
    try:
        return _install(ck, registry, policy)
    except Exception as exc:
        log.warning("RoPE backend not registered: %s: %s", type(exc).__name__, exc)
        return "RoPE: not registered (%s: %s)" % (type(exc).__name__, exc)


def _install(ck, registry, policy: str) -> str:
    try:
        import torch_npu
        from comfy_kitchen.constraints import FunctionConstraints
    except ImportError as exc:
        return "RoPE: not registered (%s)" % exc
    if policy in ("upstream", "off"):
        return "RoPE: not registered (policy %s)" % policy
    functions = [f for f in FUNCTIONS if hasattr(ck, f) and f in _eager_functions(registry)]
    if not functions:
        return "RoPE: this comfy-kitchen has no RoPE functions"
    check_inplace = registry_access.rope_inplace_check().value
    if check_inplace is None:  # in-place calls need eager's own checks, for eager's errors
        functions = [f for f in functions if not f.endswith("_")]
    call_rules = "call_rules" in getattr(FunctionConstraints, "__dataclass_fields__", {})
    backend = RopeBackend(torch_npu, registry, call_rules, check_inplace,
                          registry_access.eager_trims_rope_freqs())
    if backend.probe.problem:
        return "RoPE: not registered (%s)" % backend.probe.problem
    from ascend_shim.kitchen.backend import BackendModule

    registry.register(BACKEND, BackendModule(BACKEND, {f: backend.entry(f) for f in functions}),
                      {f: _constraints(backend, f) for f in functions})
    registry.reorder(lambda order: place(order, policy))
    _state["backend"] = backend
    return "RoPE: %s serves %d functions on npu_rotary_mul%s" % (
        BACKEND, len(functions), "/npu_rms_norm" if backend.probe.rms_norm is not None else "")


def _eager_functions(registry) -> set:
    info = registry.backend_info(EAGER) or {}
    return set(info.get("capabilities", ()))


def place(order: list, policy: str) -> list:
    """``order`` with this backend first (shim), or right before eager and after upstream's
    ``ascend`` (auto): upstream serves what it takes, the shim's INT8 order is untouched."""
    rest = [n for n in order if n != BACKEND]
    if policy == "shim":
        return [BACKEND] + rest
    at = rest.index(EAGER) if EAGER in rest else len(rest)
    if UPSTREAM in rest:
        at = max(at, rest.index(UPSTREAM) + 1)
    return rest[:at] + [BACKEND] + rest[at:]


_state: dict = {"backend": None}


def uninstall(registry) -> None:
    """Take ``ascend_shim_rope`` out of ``registry`` and forget its backend (idempotent)."""
    registry.unregister(BACKEND)
    _state["backend"] = None


def report() -> dict:
    backend = _state["backend"]
    return {"registered": backend is not None,
            "problem": backend.probe.problem if backend else None,
            "probes": {"%s%s" % (d, " rms" if r else ""): v or "ok"
                       for (d, r), v in (backend.probe._verdicts.items() if backend else ())},
            "cached_coefficients": len(CACHE), "calls": COUNTERS.as_dict()}
