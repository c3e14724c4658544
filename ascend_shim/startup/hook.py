"""What the import hook does once a watched module loads.

Loaded on the first import of a watched module (``ascend_shim.HOOKED_*``),
from inside that module's ``exec_module``: never at interpreter start.

Every watched module is executed by the real loader and then *delivered* to
the patch engine, which decides each patch once all of its modules have been
delivered. The engine starts on the first delivery; a thread that delivers
while another is starting it waits, so no module is decided before the engine
has its records, and no guard ever sees a module that is still executing.

Why not wrapt's ImportHookFinder: it calls ``importlib.util.find_spec`` from
inside ``find_spec``, while CPython holds the global import lock, and that
call waits for the parent package's module lock. A thread executing the
parent that imports anything then waits for the global lock: a deadlock
(the A-B deadlock of dd-trace-py#17742, reproduced by the 10-thread test).
Here ``find_spec`` only asks the other finders, and everything else happens
in ``exec_module``, where only the module's own lock is held. The engine is
started under a lock of ours that nothing holds while importing a watched
module, and patches are applied outside it.

Output: only through ``ascend_shim.startup.output`` (stderr where there is one).
"""

from __future__ import annotations

import os
import sys
import threading

TYPE_CHECKING = False  # typing is not imported for this: the names below are for mypy alone
if TYPE_CHECKING:
    from typing import Any, Dict, Optional

    from ascend_shim.engine.runner import Engine

import ascend_shim
from ascend_shim.startup.output import warn, write

_start_lock = threading.RLock()
_namespace_lock = threading.RLock()
_engine: Dict[str, Any] = {"object": None, "started": False}
_executing: set = set()  # watched names between exec start and delivery
_delivered: dict = {}  # name -> module object last delivered


def debug(text):
    if os.environ.get("ASCEND_SHIM_DEBUG") and _config().debug:
        write(text)


def _config():
    from ascend_shim.startup import config

    return config.get()


def _strict():
    try:
        return _config().strict
    except Exception:
        return False


def is_watched(name):
    return name in ascend_shim.HOOKED_MODULES or name.partition(".")[0] in ascend_shim.HOOKED_PACKAGES


def starting(loader, spec, module):
    """Before a watched module executes (``HookedLoader``): its parent namespace
    is delivered, the real loader put back. Returns None: nothing executed yet."""
    name = spec.name
    spec.loader = loader  # the module and later reloads see the real loader
    if module is not None:
        try:
            module.__loader__ = loader
        except AttributeError:
            pass
    _deliver_parent_namespace(name)
    if name == "torch_npu":
        _before_torch_npu()
    elif name == "comfy.model_management" and "torch_npu" in _delivered:
        _bind_default_card()
    _executing.add(name)
    return None


def executed(name, module):
    """After it ran: ``module`` is the executed module, or None when its own code raised."""
    try:
        if module is not None:
            deliver(module)
    finally:
        _executing.discard(name)


def _deliver_parent_namespace(name):
    """A namespace package (upstream ComfyUI's ``comfy/``) has no loader and
    runs no code: deliver it before its first submodule executes."""
    root = name.partition(".")[0]
    if root == name:
        return
    package = sys.modules.get(root)
    if package is None or getattr(package, "__file__", None) is not None:
        return  # not imported, or a regular package: its own loader delivers it
    if _delivered.get(root) is package:
        return
    # threads importing the first submodules at once: one delivers, the
    # others wait until it is done (the root's patches come first)
    with _namespace_lock:
        if _delivered.get(root) is not package:
            deliver(package)


def _declared_patches() -> list:
    # the one lazy arrow from startup/ up to patches/: the list this process's engine runs
    from ascend_shim.patches import PATCHES

    return PATCHES


def engine(start: bool = True, why: str = "first import of a watched module") -> Optional[Engine]:
    """This process's engine, installed and started (``why``: for the debug line); None if
    it cannot be made (warned), or, with ``start=False``, while nothing has started it yet."""
    if _engine["started"] or not start:
        return _engine["object"]
    with _start_lock:
        if not _engine["started"]:
            try:
                debug("%s: starting the patch engine" % why)
                from ascend_shim.engine.runner import Engine

                _engine["object"] = Engine(_declared_patches).install()
            except Exception as exc:
                warn("the patch engine failed to start, nothing is patched: %s: %s" % (type(exc).__name__, exc))
                if _strict():
                    raise
            finally:
                _engine["started"] = True
    return _engine["object"]


def deliver(module, late=False):
    """Hand one executed module to the engine; never raises unless strict."""
    name = getattr(module, "__name__", None)
    try:
        patcher = engine()
        _delivered[name] = module
        if patcher is not None:
            patcher.on_import(module, late=late)
        if name == "torch_npu":
            _withdraw_without_npu()
    except Exception as exc:
        if _strict():
            raise
        warn("handling the import of %s failed: %s: %s" % (name, type(exc).__name__, exc))


def _before_torch_npu():
    """In a ComfyUI process (main.py imported comfy.cli_args and set its variables before
    torch), ACL is given the cards the launcher chose before torch_npu reads them."""
    if "comfy" not in sys.modules:
        return
    try:
        from ascend_shim.startup import visible_devices

        visible_devices.carry_over()
    except Exception as exc:
        if _strict():
            raise
        warn("choosing the NPU cards failed: %s: %s" % (type(exc).__name__, exc))


def _after_torch_npu():
    from ascend_shim.startup import visible_devices

    if not visible_devices.choice():
        return
    count = None
    try:
        import torch

        count = int(torch.npu.device_count())  # type: ignore[attr-defined]
    except Exception:  # torch_npu did not import or has no runtime: no NPU here
        pass
    visible_devices.after_import(count)
    if count and "comfy.model_management" in _executing:  # it imported torch_npu itself
        _bind_default_card()


def _bind_default_card():
    """The thread about to run ComfyUI's model code, which asks for its device at import, is
    bound to the card the launcher named first (engine.default_card), unless ComfyUI's own
    flags keep it off the NPU."""
    try:
        from ascend_shim.engine import default_card

        if default_card.index() is None:
            return
        args = getattr(sys.modules.get("comfy.cli_args"), "args", None)
        if getattr(args, "cpu", False) or getattr(args, "directml", None) is not None:
            return
        default_card.bind_thread()
    except Exception as exc:
        if _strict():
            raise
        warn("selecting the NPU card failed: %s: %s" % (type(exc).__name__, exc))


def _withdraw_without_npu():
    """torch_npu has executed (its own patches decided): without a usable NPU
    no other patch will act in this process, so the shim leaves the import path."""
    from ascend_shim.engine import npu as _npu

    try:
        why = _npu.npu_reason()
    except Exception as exc:  # torch_npu without an importable torch: no NPU either
        why = "torch does not import (%s: %s)" % (type(exc).__name__, exc)
    try:
        _after_torch_npu()
    except Exception as exc:
        if _strict():
            raise
        warn("checking the NPU cards failed: %s: %s" % (type(exc).__name__, exc))
    if why:
        debug("leaving the import path: %s" % why)
        ascend_shim.withdraw(why)


def deliver_present():
    """Deliver watched modules imported before the hook existed (``late``)."""
    for name, module in sorted(list(sys.modules.items()), key=lambda item: item[0]):
        if (module is not None and is_watched(name) and name not in _executing
                and _delivered.get(name) is not module):
            deliver(module, late=True)
