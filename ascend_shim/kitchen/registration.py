"""Registering the shim's backends with comfy-kitchen and choosing their priority.

Policy (``ASCEND_SHIM_INT8``):
  auto      upstream ``ascend`` first when it offers int8_linear, then
            ``ascend_shim`` (catches what upstream declines), then the
            fallback; without upstream, ``ascend_shim`` first
  shim      ``ascend_shim`` first, then the fallback: the shim serves every
            NPU call (upstream keeps its other functions)
  upstream  only the on-device fallback, behind upstream
  off       nothing registered

What is registered is the table ``ENTRY_POINTS``: one row per comfy-kitchen
function and backend. A row's ``build(backend)`` returns the implementation
and its ``FunctionConstraints``; a row counts only where the installed
comfy-kitchen has that function. Every registry access goes through
``registry_access.KitchenRegistry``.
"""

import dataclasses
import logging
import sys
import threading
from typing import Any, Callable, Dict, Optional

from ascend_shim.startup import config as _config
from ascend_shim.kitchen.backend import (
    COUNTERS, FALLBACK, SHIM, BackendModule, Int8Backend, KitchenFeatures, npu_constraints,
)
from ascend_shim.kitchen import rope, w4a8
from ascend_shim.kitchen.registry_access import KitchenRegistry

log = logging.getLogger("ascend_shim")

UPSTREAM = "ascend"


# -- what is registered ----------------------------------------------------

def _quant_params():
    import torch
    from comfy_kitchen.constraints import ParamConstraint

    floats = frozenset({torch.float16, torch.bfloat16, torch.float32})
    halves = frozenset({torch.float16, torch.bfloat16})
    return {
        "x": ParamConstraint(dtypes=halves),
        "weight": ParamConstraint(dtypes=frozenset({torch.int8})),
        "weight_scale": ParamConstraint(dtypes=floats),
        "bias": ParamConstraint(dtypes=floats),
        "out_dtype": ParamConstraint(dtypes=halves),
    }


def _device_params():
    """Only x is device-checked (see ``backend.within``); dtypes are eager's."""
    from comfy_kitchen.constraints import ParamConstraint

    return {"x": ParamConstraint()}


def _eager(backend, function: str):
    """eager's declared constraints for ``function``: the shim's backends accept no more."""
    return backend.registry.constraints("eager", function)


def int8_quant_entry(backend):
    return backend.int8_linear, npu_constraints(backend.features, _quant_params(), backend.quant_rule,
                                                _eager(backend, "int8_linear"))


def int8_fallback_entry(backend):
    return (backend.fallback_int8_linear,
            npu_constraints(backend.features, _device_params(), backend.fallback_rule,
                            _eager(backend, "int8_linear")))


def modulated_entry(backend):
    return backend.modulated, npu_constraints(backend.features, _device_params(),
                                              eager=_eager(backend, "int8_linear_modulated"))


def rms_modulated_entry(backend):
    return backend.rms_modulated, npu_constraints(backend.features, _device_params(),
                                                  eager=_eager(backend, "int8_linear_rms_modulated"))


@dataclasses.dataclass(frozen=True)
class EntryPoint:
    """One comfy-kitchen function served by one of the shim's backends.

    ``build(backend)`` gets the ``Int8Backend`` (features, ops, capability,
    registry, fallback) and returns ``(implementation, FunctionConstraints)``.
    Rows for ``SHIM`` are registered only where the NPU quant ops can run.
    """

    function: str
    backend: str
    build: Callable


ENTRY_POINTS = (
    EntryPoint("int8_linear", SHIM, int8_quant_entry),
    EntryPoint("int8_linear", FALLBACK, int8_fallback_entry),
    EntryPoint("int8_linear_modulated", FALLBACK, modulated_entry),  # kitchen 0.2.38+
    EntryPoint("int8_linear_rms_modulated", FALLBACK, rms_modulated_entry),
    EntryPoint("w4a8_int8_linear", SHIM, w4a8.linear_entry),  # kitchen 0.2.27+
    EntryPoint("w4a8_packed_linear", SHIM, w4a8.packed_entry),  # kitchen 0.2.40+
)


@dataclasses.dataclass
class Installation:
    """What ``install`` registered, for re-ordering, reporting and removal."""

    registry: KitchenRegistry
    backend: Int8Backend
    registered: tuple
    policy: str


# -- priority --------------------------------------------------------------

def upstream_int8(registry):
    """Whether upstream's ``ascend`` backend is registered, enabled and has int8_linear."""
    return registry.offers(UPSTREAM, "int8_linear")


def desired_priority(current, policy, upstream_ok):
    """The priority list for ``policy``, keeping every other backend in order."""
    rest = [n for n in current if n not in (SHIM, FALLBACK)]
    if policy == "shim":
        head = [SHIM, FALLBACK]
    elif policy == "upstream":
        head = ([UPSTREAM] if UPSTREAM in rest else []) + [FALLBACK]
    else:  # auto
        head = ([UPSTREAM] if upstream_ok else []) + [SHIM, FALLBACK]
    return head + [n for n in rest if n not in head]


def _arrange(installation):
    """Apply the installation's policy to the registry: (priority order, decision in words)."""
    registry, policy = installation.registry, installation.policy
    upstream_ok = upstream_int8(registry)

    def arrange(current):
        order = desired_priority(current, policy, upstream_ok)
        return [n for n in order if n in installation.registered or n not in (SHIM, FALLBACK)]

    order = registry.reorder(arrange)
    if policy in ("upstream", "auto") and upstream_ok:
        decision = "upstream %r first, %s" % (
            UPSTREAM, "then ascend_shim" if SHIM in order else "then the on-device fallback")
    else:
        decision = "%s first" % order[0]
    return order, decision


# -- install / remove ----------------------------------------------------

def _entries(ck, backend, serve_npu):
    """{backend name: {function: (implementation, constraints)}} for this kitchen."""
    groups: Dict[str, dict] = {}
    for entry in ENTRY_POINTS:
        if not hasattr(ck, entry.function) or (entry.backend == SHIM and not serve_npu):
            continue
        groups.setdefault(entry.backend, {})[entry.function] = entry.build(backend)
    return groups


class KitchenInstallation:
    """The shim's backends in this process's comfy-kitchen registry.

    ``install(ck)`` registers them for the configured policy (again on a
    fresh comfy_kitchen, replacing what it registered), ``uninstall()`` leaves
    the registry as it was (idempotent).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.installed: Optional[Installation] = None
        self.decision = "not registered"
        self.policy: Optional[str] = None

    def install(self, ck: Any) -> str:
        """Register the backends for this process's policy; returns a short note."""
        import torch_npu

        registry = KitchenRegistry(ck.registry)
        policy = _config.get().int8
        backend = Int8Backend(KitchenFeatures(ck), torch_npu, registry,
                              on_broken=lambda reason: _withdraw(registry, reason))
        problem = backend.capability.problem
        groups = _entries(ck, backend, serve_npu=policy != "upstream" and not problem)
        with self._lock:
            for name, functions in groups.items():
                registry.register(name, BackendModule(name, {f: impl for f, (impl, _) in functions.items()}),
                                  {f: constraints for f, (_, constraints) in functions.items()})
            if problem and policy != "upstream":
                registry.mark_unavailable(SHIM, "NPU INT8 path off: %s" % problem)
            self.installed, self.policy = Installation(registry, backend, tuple(groups), policy), policy
            order, self.decision = _arrange(self.installed)
        note = "%s; priority %s; %s" % (self.decision, order, rope.install(ck, registry, policy))
        logging.getLogger("ascend_shim.debug").debug("kitchen: %s", note)
        return note

    def assert_priority(self) -> Optional[list]:
        """Put the policy's order back (ComfyUI rearranges backends at import)."""
        with self._lock:
            if self.installed is None:
                return None
            order, self.decision = _arrange(self.installed)
            return order

    def uninstall(self) -> None:
        """Remove the shim's backends: comfy-kitchen's registry is as it was before."""
        with self._lock:
            if self.installed is None:
                return
            for name in (SHIM, FALLBACK):
                self.installed.registry.unregister(name)
            rope.uninstall(self.installed.registry)  # its report says unregistered again
            self.installed, self.decision = None, "removed"

    def registry(self) -> Optional[KitchenRegistry]:
        if self.installed is not None:
            return self.installed.registry
        ck = sys.modules.get("comfy_kitchen")
        registry = getattr(ck, "registry", None)
        return KitchenRegistry(registry) if registry is not None else None


KITCHEN = KitchenInstallation()  # this process's
install = KITCHEN.install
assert_priority = KITCHEN.assert_priority
uninstall = KITCHEN.uninstall


def _withdraw(registry, reason):
    """The NPU INT8 path turned out unusable on this stack: kitchen stops selecting it."""
    registry.withdraw(SHIM, "NPU INT8 path off: %s" % reason)
    log.warning("NPU INT8 path off, using the dequantized fallback: %s", reason)


# -- status ------------------------------------------------------------------

def upstream_ahead(order, upstream_ok):
    """Upstream's ``ascend`` serves int8_linear: it offers it and comes before the
    shim's fallback, which takes every NPU call that reaches it."""
    if not upstream_ok or UPSTREAM not in order:
        return False
    return FALLBACK not in order or order.index(UPSTREAM) < order.index(FALLBACK)


def npu_int8_served(device=None, probe=True):
    """True while an NPU kernel (ours or upstream's) would serve int8_linear.

    With ``probe``, the shim's own path counts only after its capability
    probe passed on ``device`` (the current NPU when None).
    """
    registry = KITCHEN.registry()
    if registry is None:
        return False
    if upstream_ahead(registry.priority(), upstream_int8(registry)):
        return True
    installation = KITCHEN.installed
    if installation is None or SHIM not in installation.registered:
        return False
    if SHIM not in registry.priority() or not registry.is_available(SHIM):
        return False
    capability = installation.backend.capability
    if not probe:
        return not capability.problem
    import torch

    return capability.verdict(torch.device(device or "npu"), torch.bfloat16, False) is None


def report():
    installation = KITCHEN.installed
    registry = KITCHEN.registry()
    capability = installation.backend.capability if installation else None
    return {
        "policy": KITCHEN.policy or _config.get().int8,
        "decision": KITCHEN.decision,
        "note": ("NPU INT8 path off: %s" % capability.problem) if capability and capability.problem else "",
        "registered": list(installation.registered) if installation else [],
        "priority": registry.priority() if registry is not None else None,
        "quant_path": (capability.problem or "ok") if capability else None,
        "capability": capability.as_dict() if capability else None,
        "npu_int8_served": npu_int8_served(probe=False) if registry is not None else False,
        "calls": COUNTERS.as_dict(),
        "swiglu": installation.backend.swiglu.report() if installation else None,
    }
