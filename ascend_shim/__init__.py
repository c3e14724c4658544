"""ascend_shim: run ComfyUI on Huawei Ascend NPUs without editing any file.

This package's ``__init__`` is the whole startup path. ``ascend_shim.pth``
(``ascend_shim.start`` on Python 3.15+, the checkout's ``sitecustomize.py``
in no-install mode) calls ``init()`` in every interpreter of the venv, so it
must stay nearly free: one module, importing only what the interpreter has
loaded already (``sys``, ``os``, ``_thread``); the config reader loads only
when an ASCEND_SHIM* variable is set. Its finder costs one dict lookup per
import.

The finder watches two kinds of names: the triggers (``comfy``,
``comfy_kitchen``), whose first import starts the engine (and only then
wrapt), and the modules the engine asks to watch, whose post-import hook runs
right after the module executes and before its importer sees it.

Why not wrapt's own ImportHookFinder: it calls ``importlib.util.find_spec``
from inside ``find_spec``, i.e. while CPython holds the global import lock,
and that call waits for the parent package's module lock. A thread
executing the parent (or a hook on it) that imports anything then waits for
the global lock: a deadlock, reproduced by the 10-thread test. This finder
resolves specs by asking the other finders directly with the ``path`` it is
given, takes no lock in ``find_spec``, and runs hooks and the engine start in
``exec_module``, where only the module's own lock is held.
"""

__version__ = "0.1.0"

OFF_VALUES = ("0", "false", "off", "no")


import _thread
import os
import sys

TRIGGERS = frozenset({"comfy", "comfy_kitchen"})

_lock = _thread.RLock()
_state = {"initialized": False, "finder": None, "fired": False}
_watched = {}        # module name -> one-shot callback(module)
_executing = set()   # names whose exec_module is running under our loader
_resolving = set()   # (thread id, name) while asking the other finders


def _settings():
    """The parsed ASCEND_SHIM* settings (imported on first use, not at startup)."""
    from ascend_shim import _config

    return _config.get()


def _settings_given():
    return any(name.startswith("ASCEND_SHIM") for name in os.environ)


def _debug(message):
    if os.environ.get("ASCEND_SHIM_DEBUG") and _settings().debug:
        sys.stderr.write("ascend_shim: %s\n" % message)


class ImportHookFinder:
    """Wraps the loader of watched modules; every other import is one lookup."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname not in _watched and (_state["fired"] or fullname.partition(".")[0] not in TRIGGERS):
            return None
        key = (_thread.get_ident(), fullname)
        if key in _resolving:  # another finder re-entered the import system
            return None
        _resolving.add(key)
        try:
            spec = find_spec_skipping(self, fullname, path, target)
        finally:
            _resolving.discard(key)
        # a namespace package (upstream ComfyUI's ``comfy/`` has no __init__.py)
        # has no loader and runs no code: the engine then starts before its
        # first submodule executes, which is just as early
        if spec is not None and spec.loader is not None and not isinstance(spec.loader, HookedLoader):
            spec.loader = HookedLoader(spec.loader, spec)
        return spec

    def __repr__(self):
        return "<ascend_shim import hook>"


def find_spec_skipping(skip, fullname, path, target):
    """Ask every meta-path finder but ours (never importlib.util: see above)."""
    for finder in list(sys.meta_path):
        if finder is skip or isinstance(finder, ImportHookFinder):
            continue
        find = getattr(finder, "find_spec", None)
        if find is None:
            continue
        spec = find(fullname, path, target)
        if spec is not None:
            return spec
    return None


class HookedLoader:
    """Runs the real loader, then the module's post-import hook."""

    def __init__(self, loader, spec):
        self._loader = loader
        self._spec = spec

    def __getattr__(self, name):
        return getattr(self._loader, name)

    def create_module(self, spec):
        create = getattr(self._loader, "create_module", None)
        return create(spec) if create is not None else None

    def exec_module(self, module):
        name = self._spec.name
        # the module and later reloads see the real loader
        self._spec.loader = self._loader
        try:
            module.__loader__ = self._loader
        except AttributeError:
            pass
        _executing.add(name)
        try:
            root = name.partition(".")[0]
            if root in TRIGGERS:
                fire(root)
            self._loader.exec_module(module)
        finally:
            _executing.discard(name)
        callback = _watched.pop(name, None)
        if callback is not None:
            callback(module)


def watch(names, callback):
    """Call ``callback(module)`` once for each name, right after it executes.

    Names already imported are not watched: they are returned, and the
    caller handles them at once (as "late").
    """
    present = []
    for name in names:
        if name in sys.modules and name not in _executing:
            present.append(name)
        else:
            _watched[name] = callback
    return present


def fire(trigger):
    """Start the engine once; other threads wait until it is ready."""
    with _lock:
        if _state["fired"]:
            return
        _state["fired"] = True
        _debug("first import of %r: starting the patch engine" % trigger)
        try:
            from ascend_shim import engine

            engine.start(fresh=(trigger,))
        except Exception as exc:
            if _settings().strict:
                raise
            sys.stderr.write("ascend_shim: engine failed to start: %r\n" % (exc,))


def _install():
    """Install the finder once per process, unless ASCEND_SHIM is off."""
    with _lock:
        if _state["initialized"]:
            return
        _state["initialized"] = True
        # with no ASCEND_SHIM* variable set, the defaults apply and nothing
        # needs parsing: the config module is left for the engine to load
        if _settings_given() and not _settings().enabled:
            return
        finder = ImportHookFinder()
        _state["finder"] = finder
        sys.meta_path.insert(0, finder)
        _debug("import hook installed")
        if any(name in sys.modules for name in TRIGGERS):
            # activated after ComfyUI or comfy-kitchen was imported (an
            # explicit init() call): patch what is there, marked "late"
            fire("already imported")


def finder_installed():
    """Whether the shim's finder is in sys.meta_path."""
    return any(isinstance(f, ImportHookFinder) for f in sys.meta_path)


def init():
    """Activate the shim (idempotent; never raises into the interpreter)."""
    if os.environ.get("ASCEND_SHIM", "").strip().lower() in OFF_VALUES:
        return  # switched off: no finder, nothing else imported
    try:
        _install()
    except Exception as exc:  # a shim must never stop python from starting
        sys.stderr.write("ascend_shim: not activated: %r\n" % (exc,))


def status():
    """Per-patch state, the INT8 backend decision and the fallback report."""
    from ascend_shim import engine

    return engine.status()
