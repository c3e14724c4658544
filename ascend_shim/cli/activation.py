"""How (and whether) the shim was activated in this interpreter.

Shared by ``status`` and ``doctor`` so both tell the same story. Read it
with ``at_startup()`` before the CLI activates the shim for its own imports:
afterwards the hook is always there and proves nothing.
"""

import glob
import os
import site
import sys

from ascend_shim import OFF_VALUES


def _pth_files():
    """``ascend_shim.pth`` files in this interpreter's site-packages folders."""
    try:
        folders = list(site.getsitepackages())
    except Exception:  # some embedded/virtualenv sites lack it
        folders = []
    try:
        folders.append(site.getusersitepackages())
    except Exception:
        pass
    folders.extend(p for p in sys.path if p.endswith("site-packages"))
    found = []
    for folder in folders:
        for path in glob.glob(os.path.join(folder, "ascend_shim.pth")):
            if path not in found:
                found.append(path)
    return found


def _checkout_sitecustomize():
    """The checkout's sitecustomize.py when it is the one this interpreter ran."""
    import ascend_shim

    root = os.path.dirname(os.path.dirname(os.path.abspath(ascend_shim.__file__)))
    ours = os.path.join(root, "sitecustomize.py")
    # it may have handed sys.modules["sitecustomize"] on to the one it chained to
    chain = sys.modules.get("ascend_shim._sitecustomize_chain")
    ran = [getattr(sys.modules.get("sitecustomize"), "__file__", None)] + list(getattr(chain, "callers", ()))
    if os.path.isfile(ours) and any(path and os.path.abspath(path) == ours for path in ran):
        return ours
    return None


def switched_off():
    """The ASCEND_SHIM value that switches the shim off, or None."""
    value = os.environ.get("ASCEND_SHIM", "")
    return value if value.strip().lower() in OFF_VALUES else None


def at_startup():
    """{"active", "how", "pth", "switched_off", "why_not"}: the state before the CLI acts."""
    import ascend_shim

    installed = getattr(ascend_shim, "finder_installed", lambda: False)()
    pth = _pth_files()
    sitecustomize = _checkout_sitecustomize()
    off = switched_off()
    if pth:
        how = "ascend_shim.pth"
    elif sitecustomize:
        how = "no-install mode: PYTHONPATH=%s" % os.path.dirname(sitecustomize)
    else:
        how = None
    why_not = None
    if not installed:
        if off is not None:
            why_not = "switched off by ASCEND_SHIM=%s" % off
        elif sys.flags.no_site:
            why_not = ("python -S: the site module did not run, so neither ascend_shim.pth nor the "
                       "checkout's sitecustomize.py could")
        elif pth:
            why_not = "ascend_shim.pth is installed but did not run (python -S?)"
        else:
            why_not = ("not installed in this interpreter: no ascend_shim.pth in its site-packages "
                       "and the checkout is not on PYTHONPATH")
    return {"active": bool(installed), "how": how if installed else None, "pth": pth,
            "switched_off": off, "why_not": why_not}
