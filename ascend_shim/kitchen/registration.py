"""Registering the shim's backends with comfy-kitchen and choosing their priority.

Policy (``ASCEND_SHIM_INT8``):
  auto      upstream ``ascend`` first when it offers int8_linear, then
            ``ascend_shim`` (catches what upstream declines), then the
            fallback; without upstream, ``ascend_shim`` first
  shim      ``ascend_shim`` first, then the fallback: the shim serves every
            NPU call (upstream keeps its other functions)
  upstream  only the on-device fallback, behind upstream
  off       nothing registered
"""

import logging
import sys
import threading

from ascend_shim import _config
from ascend_shim.kitchen.backend import FALLBACK, SHIM, BackendModule, COUNTERS, Int8Linear, KitchenFeatures

log = logging.getLogger("ascend_shim")

UPSTREAM = "ascend"
QUANT_OPS = ("npu_dynamic_quant", "npu_quant_matmul")

_lock = threading.Lock()
_state = {"installed": None, "decision": "not registered", "policy": None, "reason": ""}


def upstream_int8(registry):
    """Whether upstream's ``ascend`` backend is registered, enabled and has int8_linear."""
    info = registry.list_backends().get(UPSTREAM)
    return bool(info and info["available"] and not info["disabled"]
                and "int8_linear" in info["capabilities"])


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


def _constraints(features, rule):
    """FunctionConstraints for the INT8 path and the fallback (NPU tensors only)."""
    import torch
    from comfy_kitchen.constraints import FunctionConstraints, ParamConstraint

    npu = frozenset({"npu"})
    floats = frozenset({torch.float16, torch.bfloat16, torch.float32})
    halves = frozenset({torch.float16, torch.bfloat16})
    quant_params = {
        "x": ParamConstraint(dtypes=halves),
        "weight": ParamConstraint(dtypes=frozenset({torch.int8})),
        "weight_scale": ParamConstraint(dtypes=floats),
        "bias": ParamConstraint(dtypes=floats),
        "out_dtype": ParamConstraint(dtypes=halves),
    }
    extra = {"call_rules": (rule,)} if features.call_rules else {}
    quant = FunctionConstraints(params=quant_params, default_devices=npu, **extra)
    # only x is device-checked: a CPU weight with NPU x must not fall to eager
    fallback = FunctionConstraints(params={"x": ParamConstraint()}, default_devices=npu)
    return quant, fallback


def install(ck):
    """Register the backends for this process's policy; returns a short note."""
    registry = ck.registry
    policy = _config.get().int8
    features = KitchenFeatures(ck)
    import torch_npu

    missing = [op for op in QUANT_OPS if not hasattr(torch_npu, op)]
    impl = Int8Linear(features, None if missing else torch_npu)
    quant_c, fallback_c = _constraints(features, impl.call_rule)
    fallback_functions = {"int8_linear": impl.fallback}
    fallback_caps = {"int8_linear": fallback_c}
    variants = {"int8_linear_modulated": impl.modulated,
                "int8_linear_rms_modulated": impl.rms_modulated}
    for name in features.modulated:
        fallback_functions[name] = variants[name]
        fallback_caps[name] = fallback_c
    upstream_ok = upstream_int8(registry)
    with _lock:
        registry.register(FALLBACK, BackendModule(FALLBACK, fallback_functions), fallback_caps)
        registered = [FALLBACK]
        if policy != "upstream" and not missing:
            registry.register(SHIM, BackendModule(SHIM, {"int8_linear": impl.quant}),
                              {"int8_linear": quant_c})
            registered.insert(0, SHIM)
        _state.update(installed=(registry, impl, registered), policy=policy)
        _set_priority(registry, policy, upstream_ok)
    if missing:
        _state["reason"] = "torch_npu lacks %s: NPU INT8 path off" % ", ".join(missing)
    note = "%s; priority %s" % (_state["decision"], registry._priority)
    log.debug("kitchen: %s", note)
    return note


def _set_priority(registry, policy, upstream_ok):
    order = desired_priority(list(registry._priority), policy, upstream_ok)
    if SHIM not in _state["installed"][2]:
        order = [n for n in order if n != SHIM]
    registry.set_priority(order)
    if policy in ("upstream", "auto") and upstream_ok:
        _state["decision"] = "upstream %r first, %s" % (
            UPSTREAM, "then ascend_shim" if SHIM in order else "then the on-device fallback")
    else:
        _state["decision"] = "%s first" % order[0]


def assert_priority():
    """Put the policy's order back (ComfyUI rearranges backends at import)."""
    with _lock:
        installed = _state["installed"]
        if installed is None:
            return None
        registry = installed[0]
        _set_priority(registry, _state["policy"], upstream_int8(registry))
        return list(registry._priority)


def uninstall():
    """Remove the shim's backends from comfy-kitchen's registry."""
    with _lock:
        installed = _state["installed"]
        if installed is None:
            return
        registry, _impl, names = installed
        registry.set_priority([n for n in registry._priority if n not in (SHIM, FALLBACK)])
        with registry._lock:
            for name in (SHIM, FALLBACK):
                registry._backends.pop(name, None)
                registry._capabilities.pop(name, None)
                for key in [k for k in registry._constraints if k[0] == name]:
                    registry._constraints.pop(key)
        _state.update(installed=None, decision="removed")


def npu_int8_served():
    """True while an NPU kernel (ours or upstream's) would serve int8_linear."""
    installed = _state["installed"]
    if installed is None:
        ck = sys.modules.get("comfy_kitchen")
        return bool(ck is not None and upstream_int8(ck.registry)
                    and UPSTREAM in ck.registry._priority)
    registry, impl, names = installed
    if upstream_int8(registry) and UPSTREAM in registry._priority:
        return True
    return (SHIM in names and SHIM in registry._priority and registry.is_available(SHIM)
            and not impl.quant_broken)


def report():
    installed = _state["installed"]
    ck = sys.modules.get("comfy_kitchen")
    registry = installed[0] if installed else getattr(ck, "registry", None)
    return {
        "policy": _state["policy"] or _config.get().int8,
        "decision": _state["decision"],
        "note": _state["reason"],
        "registered": list(installed[2]) if installed else [],
        "priority": list(registry._priority) if registry is not None else None,
        "quant_path": (installed[1].quant_broken or "ok") if installed else None,
        "npu_int8_served": npu_int8_served() if registry is not None else False,
        "calls": COUNTERS.as_dict(),
    }
