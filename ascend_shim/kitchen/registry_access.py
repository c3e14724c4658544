"""The one place the shim touches comfy-kitchen's internals.

comfy-kitchen's ``BackendRegistry`` (``comfy_kitchen.registry.registry``,
unchanged in 0.2.11-0.2.40 but for its default order) has public methods for
almost everything the shim needs: ``register``, ``set_priority``,
``disable``/``enable``, ``mark_unavailable``, ``list_backends``,
``get_implementation``. Two things have no public API and are read or
changed here only: the priority order itself (``_priority``) and taking a
backend out again (``unregister``). ``tests/kitchen/test_registry_access.py``
runs every method against each supported release.

The backends also reuse kitchen helpers with no public name: its
``input_act`` functions (``backends._activations``), its ConvRot
(``tensor.int8_utils._build_hadamard`` / ``_rotate_activation``), its
packed-W4A8 reader and, for RoPE, its in-place argument check
(``_rope_utils.check_rope_inplace``) and whether eager trims a longer
``freqs_cis`` (``backends.eager.rope.trim_rope_freqs``). Each is looked up here and comes back as an
``Internal``: the value, or None and why this release lacks it.
"""

import importlib
import inspect
import threading
from typing import Any, Callable, Iterable, List, NamedTuple, Optional


class Internal(NamedTuple):
    """A comfy-kitchen internal: ``value``, or None and ``missing`` (why)."""

    value: Any
    missing: Optional[str] = None


def _lookup(module: str, name: str) -> Internal:
    try:
        found = importlib.import_module(module)
    except ImportError as exc:
        return Internal(None, "this comfy-kitchen has no %s (%s)" % (module, exc))
    value = getattr(found, name, None)
    if value is None:
        return Internal(None, "this comfy-kitchen's %s has no %s" % (module, name))
    return Internal(value)


def apply_input_act() -> Internal:
    """kitchen's ``apply_input_act(x, input_act[, weight, eps])`` (0.2.2x+)."""
    return _lookup("comfy_kitchen.backends._activations", "apply_input_act")


def input_act_names() -> frozenset:
    """The ``input_act`` values this kitchen defines; ``{None}`` when it defines none."""
    codes = _lookup("comfy_kitchen.backends._activations", "INPUT_ACT_TO_CODE").value
    return frozenset(codes) if codes else frozenset({None})


def convrot() -> Internal:
    """``(build_hadamard(group, device=, dtype=), rotate_activation(x, h, group))``."""
    module = "comfy_kitchen.tensor.int8_utils"
    build = _lookup(module, "_build_hadamard")
    rotate = _lookup(module, "_rotate_activation")
    if build.missing or rotate.missing:
        return Internal(None, build.missing or rotate.missing)
    return Internal((build.value, rotate.value))


def w4a8_packed_reader() -> Internal:
    """``unpack(qdata, n, k) -> (qdata, s_rel)`` for packed W4A8 records (0.2.40+)."""
    found = _lookup("comfy_kitchen.tensor.w4a8_packed", "unpack_w4a8_mma_weight")
    if found.value is not None and len(inspect.signature(found.value).parameters) != 3:
        return Internal(None, "this comfy-kitchen's unpack_w4a8_mma_weight takes other arguments")
    return found


def rope_inplace_check() -> Internal:
    """Eager's check of in-place RoPE arguments, ``check_rope_inplace(*xs, readonly=...)`` (0.2.2x+)."""
    return _lookup("comfy_kitchen._rope_utils", "check_rope_inplace")


def eager_trims_rope_freqs() -> bool:
    """Whether this kitchen's eager trims a longer interleaved ``freqs_cis`` (0.2.26+)."""
    return _lookup("comfy_kitchen.backends.eager.rope", "trim_rope_freqs").value is not None


class KitchenInternalMissing(AttributeError):
    """The installed comfy-kitchen's registry lacks an internal the shim needs."""


def _private(registry: Any, name: str) -> Any:
    try:
        return getattr(registry, name)
    except AttributeError:
        raise KitchenInternalMissing(
            "this comfy-kitchen's BackendRegistry has no %s: ascend_shim cannot "
            "read or change its backend order; update ascend_shim" % name) from None


class KitchenRegistry:
    """comfy-kitchen's registry, as the shim uses it."""

    def __init__(self, registry: Any) -> None:
        self.registry = registry
        # serialises the shim's read-modify-write of the priority list
        self._lock = threading.Lock()

    # -- public API -----------------------------------------------------
    def register(self, name: str, module: Any, capabilities: dict) -> None:
        self.registry.register(name, module, capabilities)

    def backend_info(self, name: str) -> Optional[dict]:
        """``list_backends()``'s entry for ``name``, or None."""
        return self.registry.list_backends().get(name)

    def offers(self, name: str, function: str) -> bool:
        """Registered, not disabled, and implements ``function``."""
        info = self.backend_info(name)
        return bool(info and info["available"] and not info["disabled"]
                    and function in info["capabilities"])

    def is_available(self, name: str) -> bool:
        return self.registry.is_available(name)

    def mark_unavailable(self, name: str, reason: str) -> None:
        """Shown by ``ck.list_backends()`` as the backend's ``unavailable_reason``."""
        self.registry.mark_unavailable(name, reason)

    def withdraw(self, name: str, reason: str) -> None:
        """Stop selecting a registered backend and say why in ``list_backends()``."""
        self.registry.disable(name)
        self.registry.mark_unavailable(name, reason)

    def implementation(self, function: str, backend: str) -> Callable:
        return self.registry.get_implementation(function, backend=backend)

    def constraints(self, backend: str, function: str) -> Any:
        """The ``FunctionConstraints`` ``backend`` declared for ``function``, or None."""
        return self.registry.get_constraints(backend, function)

    def set_priority(self, order: Iterable[str]) -> None:
        self.registry.set_priority(list(order))

    # -- no public API ----------------------------------------------------
    def priority(self) -> List[str]:
        """The selection order (``list_backends()`` shows none)."""
        return list(_private(self.registry, "_priority"))

    def reorder(self, arrange: Callable[[List[str]], Iterable[str]]) -> List[str]:
        """``set_priority(arrange(current order))`` as one step; returns the new order."""
        with self._lock:
            order = list(arrange(self.priority()))
            self.set_priority(order)
            return order

    def unregister(self, name: str) -> None:
        """Take ``name`` out completely: backend, capabilities, constraints,
        disabled/unavailable marks and its place in the priority list."""
        registry = self.registry
        self.reorder(lambda order: [n for n in order if n != name])
        with _private(registry, "_lock"):
            for table in ("_backends", "_capabilities", "_unavailable"):
                _private(registry, table).pop(name, None)
            constraints = _private(registry, "_constraints")
            for key in [k for k in constraints if k[0] == name]:
                constraints.pop(key)
            _private(registry, "_disabled").discard(name)
