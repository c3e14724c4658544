"""The one place the shim touches comfy-kitchen's backend registry.

comfy-kitchen's ``BackendRegistry`` (``comfy_kitchen.registry.registry``,
unchanged in 0.2.11-0.2.40 but for its default order) has public methods for
almost everything the shim needs: ``register``, ``set_priority``,
``disable``/``enable``, ``mark_unavailable``, ``list_backends``,
``get_implementation``. Two things have no public API and are read or
changed here only: the priority order itself (``_priority``) and taking a
backend out again (``unregister``). ``tests/kitchen/test_registry_access.py``
runs every method against each supported release.
"""

import threading


class KitchenRegistry:
    """comfy-kitchen's registry, as the shim uses it."""

    def __init__(self, registry):
        self.registry = registry
        # serialises the shim's read-modify-write of the priority list
        self._lock = threading.Lock()

    # -- public API -----------------------------------------------------
    def register(self, name, module, capabilities):
        self.registry.register(name, module, capabilities)

    def backend_info(self, name):
        """``list_backends()``'s entry for ``name``, or None."""
        return self.registry.list_backends().get(name)

    def offers(self, name, function):
        """Registered, not disabled, and implements ``function``."""
        info = self.backend_info(name)
        return bool(info and info["available"] and not info["disabled"]
                    and function in info["capabilities"])

    def is_available(self, name):
        return self.registry.is_available(name)

    def mark_unavailable(self, name, reason):
        """Shown by ``ck.list_backends()`` as the backend's ``unavailable_reason``."""
        self.registry.mark_unavailable(name, reason)

    def withdraw(self, name, reason):
        """Stop selecting a registered backend and say why in ``list_backends()``."""
        self.registry.disable(name)
        self.registry.mark_unavailable(name, reason)

    def implementation(self, function, backend):
        return self.registry.get_implementation(function, backend=backend)

    def constraints(self, backend: str, function: str):
        """The ``FunctionConstraints`` ``backend`` declared for ``function``, or None."""
        return self.registry.get_constraints(backend, function)

    def set_priority(self, order):
        self.registry.set_priority(list(order))

    # -- no public API ----------------------------------------------------
    def priority(self):
        """The selection order (``list_backends()`` shows none)."""
        return list(self.registry._priority)

    def reorder(self, arrange):
        """``set_priority(arrange(current order))`` as one step; returns the new order."""
        with self._lock:
            order = list(arrange(self.priority()))
            self.set_priority(order)
            return order

    def unregister(self, name):
        """Take ``name`` out completely: backend, capabilities, constraints,
        disabled/unavailable marks and its place in the priority list."""
        registry = self.registry
        self.reorder(lambda order: [n for n in order if n != name])
        with registry._lock:
            registry._backends.pop(name, None)
            registry._capabilities.pop(name, None)
            for key in [k for k in registry._constraints if k[0] == name]:
                registry._constraints.pop(key)
            registry._disabled.discard(name)
            registry._unavailable.pop(name, None)
