"""The registry accessor and the install/uninstall lifecycle against one real comfy-kitchen.

Run in a fresh interpreter on the test bed with the checkout importable and
the shim not started (``ASCEND_SHIM=0``: this script installs it itself).
Prints one JSON object; ``test_registry_access.py`` asserts on it.
"""

import json
import types

import torch
import torch_npu  # noqa: F401  (registers the npu device)

import comfy_kitchen as ck
from comfy_kitchen.constraints import FunctionConstraints
from comfy_kitchen.exceptions import NoCapableBackendError

from ascend_shim.kitchen import registration, registry_access, w4a8
from ascend_shim.kitchen.backend import SHIM, Int8Backend, KitchenFeatures
from ascend_shim.kitchen.contract import int8_linear_call
from ascend_shim.kitchen.registry_access import KitchenRegistry

NAME = "registry_case"
CPU_ONLY = FunctionConstraints(params={}, default_devices=frozenset({"cpu"}))


def snapshot():
    return {"backends": ck.list_backends(), "priority": list(ck.registry._priority)}


def selected(q):
    kwargs = {"q": q, "scale": torch.ones((), dtype=torch.float32)}
    try:
        return ck.registry.get_capable_backend("dequantize_int8_simple", kwargs)
    except NoCapableBackendError as exc:
        return "none: %s" % exc


def accessor_steps():
    access = KitchenRegistry(ck.registry)
    before = snapshot()
    steps = {"priority_matches": access.priority() == before["priority"]}
    module = types.SimpleNamespace(dequantize_int8_simple=lambda q, scale: q)
    access.register(NAME, module, {"dequantize_int8_simple": CPU_ONLY})
    order = access.reorder(lambda current: [NAME] + current)
    x = torch.ones(2, dtype=torch.int8)
    steps.update(
        first=order[0] == NAME and access.priority()[0] == NAME,
        offers=access.offers(NAME, "dequantize_int8_simple"),
        selected=selected(x),
        eager_implementation=access.implementation("dequantize_int8_simple", "eager").__module__,
    )
    access.withdraw(NAME, "no device here")
    info = ck.list_backends()[NAME]
    steps.update(withdrawn=info, offers_withdrawn=access.offers(NAME, "dequantize_int8_simple"),
                 selected_withdrawn=selected(x))
    access.mark_unavailable("never_registered", "its library is missing")
    steps["unavailable"] = ck.list_backends()["never_registered"]
    access.unregister(NAME)
    access.unregister("never_registered")
    steps["restored"] = snapshot() == before
    return steps


def lifecycle():
    before = snapshot()
    note = registration.install(ck)
    installed = snapshot()
    report = registration.report()
    registration.uninstall()
    return {"note": note, "installed_priority": installed["priority"],
            "installed_backends": sorted(installed["backends"]), "registered": report["registered"],
            "restored": snapshot() == before}


def extra_entry_point():
    """A new row in ENTRY_POINTS is all it takes to serve another function."""
    def build(backend):
        return (lambda q, scale: q), FunctionConstraints(params={}, default_devices=frozenset({"npu"}))

    before = snapshot()
    saved = registration.ENTRY_POINTS
    registration.ENTRY_POINTS = saved + (registration.EntryPoint("dequantize_int8_simple", SHIM, build),)
    try:
        registration.install(ck)
        capabilities = ck.list_backends()[SHIM]["capabilities"]
        registration.uninstall()
    finally:
        registration.ENTRY_POINTS = saved
    return {"capabilities": capabilities, "restored": snapshot() == before}


def internals():
    """What the adapter finds of kitchen's private helpers, and a release without its ConvRot."""
    out = {}
    for name in ("apply_input_act", "convrot", "w4a8_packed_reader"):
        found = getattr(registry_access, name)()
        out[name] = {"found": found.value is not None, "missing": found.missing}
    out["input_acts"] = sorted(str(a) for a in registry_access.input_act_names())
    from comfy_kitchen.tensor import int8_utils

    saved = int8_utils._build_hadamard
    del int8_utils._build_hadamard
    try:
        backend = Int8Backend(KitchenFeatures(ck), torch_npu, KitchenRegistry(ck.registry))
        x = torch.ones(4, 256, dtype=torch.bfloat16).to("npu")
        call = int8_linear_call(x, torch.ones(8, 256, dtype=torch.int8).to("npu"),
                                torch.ones(8).to("npu"), convrot=True)
        out["without_convrot"] = {
            "convrot": registry_access.convrot().missing,
            "quant": backend.decline_reason(call),
            "fallback": backend.fallback_decline(call),
            "w4a8": w4a8.bound_to(backend).check_call({"x": x}),
        }
    finally:
        int8_utils._build_hadamard = saved
    return out


print(json.dumps({"version": ck.__version__ if hasattr(ck, "__version__") else None,
                  "accessor": accessor_steps(), "lifecycle": lifecycle(),
                  "extra_entry_point": extra_entry_point(), "internals": internals()}))
