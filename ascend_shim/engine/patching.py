"""The patch-writing API: what every patch module imports, and nothing else.

A patch module declares one ``PATCH = Patch(...)``; the engine
(``ascend_shim.engine.runner``) imports the patch modules and runs them. This module
imports no other part of the shim, so no import cycle can pass through it.

wrapt does every wrap. It is imported on the first wrap, not here: the
engine and ``status`` must work (and say what is wrong) where wrapt is
missing or broken. Any wrapt from 1.14 on works; the undo bookkeeping is the
shim's own, so it does not need wrapt 2.5's ``unwrap_object``.
"""

from __future__ import annotations

import functools

from typing import Any, Callable, Dict, Optional, Sequence

PENDING, APPLYING, APPLIED, SKIPPED, FAILED, DISABLED, REMOVED = (
    "pending", "applying", "applied", "skipped", "failed", "disabled", "removed",
)

Guard = Callable[[Any], Optional[str]]


class Patch:
    """One patch unit.

    name     what ASCEND_SHIM_DISABLE and ``status`` call it
    target   the module whose attributes are changed
    requires other modules that must have executed before the guard decides
    after    other patches that must be *applied* first; the engine orders
             by it and skips this one (saying which) when one of them is not
    guard    ``guard(module) -> None | str``: None applies, a string is why
             the patch is skipped on this machine / version
    apply    ``apply(changes, module)``; every change goes through ``changes``
    remove   optional clean-up ``remove(module)`` after the generic undo
    version  optional ``version(module) -> str | None``: the target package's
             version, shown by ``status``
    report   optional ``report() -> dict | None``: named sections ``status``
             shows (``{"int_mm": {...}}``); read cheaply, without importing
             what was never loaded
    """

    def __init__(self, name: str, target: str, summary: str,
                 apply: Callable[["Changes", Any], None], guard: Optional[Guard] = None,
                 requires: Sequence[str] = (), after: Sequence[str] = (),
                 remove: Optional[Callable[[Any], None]] = None,
                 version: Optional[Callable[[Any], Optional[str]]] = None,
                 report: Optional[Callable[[], Optional[Dict[str, Any]]]] = None):
        self.name = name
        self.target = target
        self.summary = summary
        self.apply = apply
        self.guard = guard
        self.requires = tuple(requires)
        self.after = tuple(after)
        self.remove = remove
        self.version = version
        self.report = report

    @property
    def modules(self) -> tuple:
        return (self.target,) + self.requires

    def __repr__(self) -> str:
        return "<Patch %s on %s>" % (self.name, self.target)


_MISSING = object()


class NotAFunction(Exception):
    """What a patch would wrap is not a function (``synchronize = None``): the
    engine skips the patch with this reason instead of wrapping it."""


def _not_a_function(parent: Any, name: str, original: Any) -> Optional[str]:
    """Why ``original`` cannot be wrapped as a function, or None when it can."""
    if callable(original) or isinstance(original, (classmethod, staticmethod)):
        return None
    owner = getattr(parent, "__qualname__", None) or getattr(parent, "__name__", type(parent).__name__)
    return "%s.%s is %s, not a function: left as it is" % (
        owner, name, "None" if original is None else "a %s" % type(original).__name__)


def argument(args: tuple, kwargs: dict, position: int, name: str, default: Any = None) -> Any:
    """The argument a wrapped function received at ``position`` or as ``name``."""
    if len(args) > position:
        return args[position]
    return kwargs.get(name, default)


def bind(wrapper: Callable, module: Any) -> Callable:
    """A wrapt wrapper that also receives the module it was applied to.

    ``wrapper(module, wrapped, instance, args, kwargs)``: the wrapper never
    looks its module up in ``sys.modules``, which may hold another object by
    the time it runs (``del sys.modules[...]``, a re-import).
    """

    # a partial, not a closure: no frame of its own between ComfyUI's caller and the wrapper
    # in a traceback
    bound = functools.partial(wrapper, module)
    bound.__name__ = getattr(wrapper, "__name__", "bound")  # type: ignore[attr-defined]
    return bound


def _wrapper_class():
    """A wrapt FunctionWrapper that behaves like the function it replaces.

    Plain functions pickle by reference and copy as themselves; so do these
    (wrapt's proxies refuse both). A method reached through its class is so too:
    one object for every such access (``A.f is A.f``, as for a plain function)
    that pickles as ``A.f``. Ray's actors need it: Ray wraps each method of an
    actor class as read from the class and pickles those wrappers with the class,
    each method by reference where it is found again under its name. The
    ``enabled`` switch lets an undo turn a wrapper off where another wrapper was
    stacked on top of it.
    """
    global _ShimWrapper
    if _ShimWrapper is None:
        import wrapt

        class PicklesByName:
            """Pickled as the name of the function wrapped (its ``__qualname__``, through the proxy)."""

            __slots__ = ()

            def __reduce_ex__(self, protocol):
                return self.__reduce__()

            def __reduce__(self):
                return self.__qualname__  # type: ignore[attr-defined]  # the wrapped function's

        class ShimBoundWrapper(PicklesByName, wrapt.BoundFunctionWrapper):
            pass

        class ShimWrapper(PicklesByName, wrapt.FunctionWrapper):
            __bound_function_wrapper__ = ShimBoundWrapper

            def __get__(self, instance, owner=None):
                bound = super().__get__(instance, owner)
                # a classmethod binds its class, so only a plain function's is one object for every class
                if instance is not None or type(bound) is not ShimBoundWrapper or self._self_binding != "function":
                    return bound
                try:  # a function reached through a class: the one object of every such access
                    return object.__getattribute__(self, "_self_through_class")
                except AttributeError:
                    self._self_through_class = bound
                    return bound

            def __copy__(self):
                return self

            def __deepcopy__(self, memo):
                return self

        _ShimWrapper = ShimWrapper
    return _ShimWrapper


_ShimWrapper: Optional[type] = None


class _Switch:
    __slots__ = ("on",)

    def __init__(self):
        self.on = True

    def __call__(self):
        return self.on


def _current(owner, attribute):
    """The attribute as stored (a class's own dict entry, not a bound method)."""
    if isinstance(owner, type):
        return vars(owner).get(attribute, _MISSING)
    return getattr(owner, attribute, _MISSING)


def _in_chain(value, wrapper) -> bool:
    """Whether ``wrapper`` is ``value`` or reachable through ``__wrapped__``."""
    for _ in range(64):
        if value is wrapper:
            return True
        value = getattr(value, "__wrapped__", _MISSING)
        if value is _MISSING:
            return False
    return False


class Changes:
    """Records wraps and attribute assignments so they can be undone exactly.

    Undo restores only what is still the shim's: a value or function that
    someone replaced after the patch is left as they set it.
    """

    def __init__(self):
        self.wraps: list = []     # (owner, attribute, original, wrapper, switch)
        self.assigned: list = []  # (owner, attribute, old value or _MISSING, new value)
        self.notes: list = []

    def wrap(self, owner: Any, attribute: str, wrapper: Callable) -> Any:
        """Wrap ``owner.attribute`` (``"Cls.method"`` allowed) with a wrapt wrapper."""
        import wrapt

        parent, name, original = wrapt.resolve_path(owner, attribute)
        reason = _not_a_function(parent, name, original)
        if reason:
            raise NotAFunction(reason)
        switch = _Switch()
        replacement = _wrapper_class()(original, wrapper, enabled=switch)
        wrapt.apply_patch(parent, name, replacement)
        self.wraps.append((parent, name, original, replacement, switch))
        return replacement

    def assign(self, owner: Any, attribute: str, value: Any) -> None:
        old = getattr(owner, attribute, _MISSING)
        setattr(owner, attribute, value)
        self.assigned.append((owner, attribute, old, value))

    def note(self, text: str) -> None:
        self.notes.append(text)

    def undo(self) -> None:
        for parent, name, original, replacement, switch in reversed(self.wraps):
            switch.on = False  # inert even where something else still holds it
            if _current(parent, name) is replacement:
                setattr(parent, name, original)
        for owner, attribute, old, new in reversed(self.assigned):
            if getattr(owner, attribute, _MISSING) is not new:
                continue  # changed since: the new value is someone else's
            if old is _MISSING:
                delattr(owner, attribute)
            else:
                setattr(owner, attribute, old)
        self.wraps.clear()
        self.assigned.clear()

    def in_place(self) -> bool:
        """True while every change is still what the module holds."""
        for parent, name, _original, replacement, switch in self.wraps:
            if not switch.on or not _in_chain(_current(parent, name), replacement):
                return False
        for owner, attribute, _old, new in self.assigned:
            if getattr(owner, attribute, _MISSING) is not new:
                return False
        return True
