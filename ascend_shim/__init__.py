"""ascend_shim: run ComfyUI on Huawei Ascend NPUs without editing any file."""

# This module is all that runs at interpreter start (ascend_shim.pth, or
# ascend_shim.start on 3.15+, or the checkout's sitecustomize.py), in every
# python of the venv: it defines the import finder and init(), and the rest
# loads on the first import of a watched module (ascend_shim.startup.hook, which
# also says why the finder is our own). Comments rather than docstrings
# below: they cost nothing to load.

__version__ = "0.2.0"

import sys

# every module of these packages goes through the hook ...
HOOKED_PACKAGES = frozenset(("comfy", "comfy_kitchen"))
# ... and these modules alone (not their submodules)
HOOKED_MODULES = frozenset(("torch_npu", "execution"))
OFF_VALUES = ("0", "false", "off", "no", "n", "disable", "disabled")

_resolving: set = set()  # (thread id, name) while the other finders are asked
_loaders: list = []  # [HookedLoader, LegacyHookedLoader], made on first use
_withdrawn: list = []  # [why] once the shim has left the import path for good
_npu_installed: list = []  # [bool]: whether torch_npu can be found, asked once


class ImportHookFinder:
    # Hands watched modules a loader that runs the shim after them; every
    # other import costs one set lookup. find_spec runs under the global
    # import lock, so it imports nothing and calls no importlib helper: it
    # asks the other finders itself.

    def find_spec(self, fullname, path=None, target=None):
        if fullname not in HOOKED_MODULES and fullname.partition(".")[0] not in HOOKED_PACKAGES:
            return None
        from _thread import get_ident  # built in: no file is read

        key = (get_ident(), fullname)
        if key in _resolving:  # another finder re-entered the import system
            return None
        if not _npu_installed:
            # every patch needs torch_npu: without it the shim will never act
            # here, so it leaves the import path before ComfyUI runs through it
            _resolving.add(key)
            try:
                _npu_installed.append(fullname == "torch_npu" or
                                      _ask_other_finders(self, "torch_npu", None, None) is not None)
            finally:
                _resolving.discard(key)
        if not _npu_installed[0]:
            withdraw("torch_npu is not installed")
            return None
        _resolving.add(key)
        try:
            spec = _ask_other_finders(self, fullname, path, target)
        finally:
            _resolving.discard(key)
        loader = getattr(spec, "loader", None)
        if loader is not None:
            hooked, legacy = _loaders or _make_loaders()
            if not isinstance(loader, (hooked, legacy)):
                spec.loader = (hooked if hasattr(loader, "exec_module") else legacy)(loader, spec)
        return spec

    def __repr__(self):
        return "<ascend_shim import hook>"


def _ask_other_finders(skip, fullname, path, target):
    for finder in list(sys.meta_path):
        if finder is skip or isinstance(finder, ImportHookFinder):
            continue
        find = getattr(finder, "find_spec", None)
        if find is not None:
            spec = find(fullname, path, target)
            if spec is not None:
                return spec
    return None


def _make_loaders():
    class HookedLoader:
        # the real loader, then the shim (_hook.run); offers what the real one offers
        def __init__(self, loader, spec):
            self._loader = loader
            self._spec = spec

        def __getattr__(self, name):
            return getattr(self._loader, name)

        def create_module(self, spec):
            create = getattr(self._loader, "create_module", None)
            return create(spec) if create is not None else None

        def exec_module(self, module):
            from ascend_shim.startup import hook as _hook

            _hook.run(self._loader, self._spec, module)

    class LegacyHookedLoader:
        # for a loader with only load_module: no exec_module is offered
        def __init__(self, loader, spec):
            self._loader = loader
            self._spec = spec

        def __getattr__(self, name):
            return getattr(self._loader, name)

        def load_module(self, fullname):
            from ascend_shim.startup import hook as _hook

            return _hook.run_legacy(self._loader, self._spec, fullname)

    if not _loaders:
        _loaders[:] = [HookedLoader, LegacyHookedLoader]
    return _loaders


def init() -> None:
    # Activate the shim in this interpreter (idempotent; never raises).
    try:
        from os import environ

        if environ.get("ASCEND_SHIM", "").strip().lower() in OFF_VALUES:
            return  # switched off: no finder, nothing else imported
        if finder_installed() or _withdrawn:
            return  # on the path already, or left it for good
        if any(name.startswith("ASCEND_SHIM") for name in environ):
            from ascend_shim.startup import config as _config  # parsed only when something is set

            if not _config.get().enabled:
                return
        sys.meta_path.insert(0, ImportHookFinder())
        if environ.get("ASCEND_SHIM_DEBUG"):
            from ascend_shim.startup import hook as _hook

            _hook.debug("import hook installed")
        if any(name in sys.modules for name in HOOKED_MODULES | HOOKED_PACKAGES):
            # activated after ComfyUI or comfy-kitchen was imported: patch
            # what is there now, marked "late"
            from ascend_shim.startup import hook as _hook

            _hook.deliver_present()
    except Exception as exc:  # a shim must never stop python from starting
        try:
            from ascend_shim.startup import hook as _hook

            _hook.warn("not activated: %r" % (exc,))
        except Exception:
            pass


def withdraw(why: str) -> None:
    # Leave the import path for good: no later import passes through the
    # shim, so its frames stay out of tracebacks where it does nothing.
    # sys.meta_path is replaced, not edited in place: an import iterating over
    # the old list (this very find_spec's caller, or another thread's) must
    # not skip the finder after ours.
    if not _withdrawn:
        _withdrawn.append(why)
    if finder_installed():
        sys.meta_path = [f for f in sys.meta_path if not isinstance(f, ImportHookFinder)]
    if _loaders:  # specs handed out earlier and not yet executed get their own loader back
        hooked = tuple(_loaders)
        for module in list(sys.modules.values()):
            spec = getattr(module, "__spec__", None)
            loader = getattr(spec, "loader", None)
            if spec is not None and isinstance(loader, hooked):
                try:
                    spec.loader = loader._loader
                except Exception:
                    pass


def withdrawn() -> "str | None":
    # Why the shim left the import path, or None while it is on it.
    return _withdrawn[0] if _withdrawn else None


def finder_installed() -> bool:
    # Whether the shim's finder is in sys.meta_path.
    return any(isinstance(f, ImportHookFinder) for f in sys.meta_path)


def status() -> dict:
    # Per-patch state, the INT8 backend decision and the fallback report.
    from ascend_shim.engine import runner as engine

    return engine.status()
