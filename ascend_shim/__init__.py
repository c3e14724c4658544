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
HOOKED_PACKAGES = frozenset(("comfy", "comfy_kitchen", "raylight", "yunchang"))
# ... and these modules alone (not their submodules)
HOOKED_MODULES = frozenset(("torch_npu", "execution"))
OFF_VALUES = ("0", "false", "off", "no", "n", "disable", "disabled")


class ImportHookFinder:
    # The import hook: hands watched modules a loader that runs the shim after
    # them; every other import costs one set lookup. install() puts it first in
    # sys.meta_path, uninstall() takes it out (both idempotent); withdraw()
    # takes it out for good. find_spec runs under the global import lock, so
    # it imports nothing and calls no importlib helper: it asks the other
    # finders itself.

    def __init__(self) -> None:
        self._resolving: set = set()  # (thread id, name) while the other finders are asked
        self._npu_installed: "bool | None" = None  # whether torch_npu can be found, asked once
        self._loader_class: "type | None" = None  # HookedLoader, made on first use
        self.withdrawn: "str | None" = None  # why the shim left the import path for good

    def find_spec(self, fullname, path=None, target=None):
        if fullname not in HOOKED_MODULES and fullname.partition(".")[0] not in HOOKED_PACKAGES:
            return None
        from _thread import get_ident  # built in: no file is read

        key = (get_ident(), fullname)
        if key in self._resolving:  # another finder re-entered the import system
            return None
        if self._npu_installed is None:
            # every patch needs torch_npu: without it the shim will never act
            # here, so it leaves the import path before ComfyUI runs through it
            self._resolving.add(key)
            try:
                self._npu_installed = (fullname == "torch_npu" or
                                       self._ask_other_finders("torch_npu", None, None) is not None)
            finally:
                self._resolving.discard(key)
        if not self._npu_installed:
            self.withdraw("torch_npu is not installed")
            return None
        self._resolving.add(key)
        try:
            spec = self._ask_other_finders(fullname, path, target)
        finally:
            self._resolving.discard(key)
        loader = getattr(spec, "loader", None)
        if loader is not None:
            hooked = self._loader_class or self._make_loader_class()
            if not isinstance(loader, hooked):
                spec.loader = hooked(loader, spec)
        return spec

    def _ask_other_finders(self, fullname, path, target):
        for finder in list(sys.meta_path):
            if finder is self or isinstance(finder, ImportHookFinder):
                continue
            find = getattr(finder, "find_spec", None)
            if find is not None:
                spec = find(fullname, path, target)
                if spec is not None:
                    return spec
        return None

    def _make_loader_class(self) -> type:
        class HookedLoader:
            # The real loader, then the shim (startup.hook.executed); offers exactly
            # what the real one offers, so a loader that predates exec_module
            # is run through load_module.
            def __init__(self, loader, spec):
                self._loader = loader
                self._spec = spec

            def __getattr__(self, name):
                real = getattr(self._loader, name, None)
                modern = hasattr(self._loader, "exec_module")
                if name == "exec_module" and modern:
                    return self._exec_module
                if name == "create_module" and modern:
                    return real or (lambda spec: None)
                if name == "load_module" and real is not None and not modern:
                    return self._load_module
                if real is None:
                    return getattr(self._loader, name)  # the real loader's AttributeError
                return real

            # One shim frame per watched module in a traceback, and its source
            # line says whose code raised: the module's own, run unchanged.
            def _exec_module(self, module):
                from ascend_shim.startup import hook as _hook

                done = _hook.starting(self._loader, self._spec, module)
                try:
                    self._loader.exec_module(module)  # ascend_shim only runs this module's own code here: what raised is in the frames below
                    done = module
                finally:
                    _hook.executed(self._spec.name, done)

            def _load_module(self, fullname):
                from ascend_shim.startup import hook as _hook

                done = _hook.starting(self._loader, self._spec, None)
                try:
                    done = self._loader.load_module(fullname)  # ascend_shim only runs this module's own code here: what raised is in the frames below
                finally:
                    _hook.executed(fullname, done)
                return done

        if self._loader_class is None:
            self._loader_class = HookedLoader
        return self._loader_class

    def installed(self) -> bool:
        return any(f is self for f in sys.meta_path)

    def install(self) -> bool:
        # First in sys.meta_path, once; False where it withdrew for good.
        if self.withdrawn is not None:
            return False
        if not self.installed():
            sys.meta_path.insert(0, self)
        return True

    def uninstall(self) -> None:
        # Out of sys.meta_path; install() brings it back. The list is replaced,
        # not edited in place: an import iterating over the old one (this very
        # find_spec's caller, or another thread's) must not skip the finder
        # after ours.
        if self.installed():
            sys.meta_path = [f for f in sys.meta_path if f is not self]
        hooked = self._loader_class
        if hooked is not None:  # specs handed out and not yet executed get their own loader back
            for module in list(sys.modules.values()):
                spec = getattr(module, "__spec__", None)
                loader = getattr(spec, "loader", None)
                if spec is not None and isinstance(loader, hooked):
                    try:
                        spec.loader = getattr(loader, "_loader")
                    except Exception:
                        pass

    def withdraw(self, why: str) -> None:
        # Leave the import path for good: no later import passes through the
        # shim, so its frames stay out of tracebacks where it does nothing.
        if self.withdrawn is None:
            self.withdrawn = why
        self.uninstall()

    def __repr__(self) -> str:
        return "<ascend_shim import hook>"


HOOK = ImportHookFinder()  # this interpreter's import hook


def init() -> None:
    # Activate the shim in this interpreter (idempotent; never raises).
    try:
        from os import environ

        if environ.get("ASCEND_SHIM", "").strip().lower() in OFF_VALUES:
            return  # switched off: no finder, nothing else imported
        if finder_installed() or HOOK.withdrawn is not None:
            return  # on the path already, or left it for good
        if any(name.startswith("ASCEND_SHIM") for name in environ):
            from ascend_shim.startup import config as _config  # parsed only when something is set

            if not _config.get().enabled:
                return
        HOOK.install()
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
    # Leave the import path for good (HOOK.withdraw).
    HOOK.withdraw(why)


def withdrawn() -> "str | None":
    # Why the shim left the import path, or None while it is on it.
    return HOOK.withdrawn


def finder_installed() -> bool:
    # Whether a shim finder is in sys.meta_path.
    return any(isinstance(f, ImportHookFinder) for f in sys.meta_path)


def status() -> dict:
    # Per-patch state and what every patch declares it reports (the engine's status).
    from ascend_shim.startup import hook as _hook

    engine = _hook.engine(why="status asked")
    if engine is None:
        raise RuntimeError("the patch engine could not be made (see the warning above)")
    return engine.status()
