"""``status --import``: import what the user asked, then the modules pending patches wait for.

A module a release does not have (or whose package it does not have) is "not in this version",
not a failure; anything else that stops an import is said, and ``status`` exits 1.
"""

import contextlib
import importlib
import io
import sys
from typing import Any, Dict

NOT_THERE = "not in this version"


def one_line(exc):
    text = str(exc).strip()
    return "%s: %s" % (type(exc).__name__, text.splitlines()[0] if text else "")


def import_one(name):
    """None when ``name`` imports, else the error in one line.

    What the module prints goes to stderr: stdout carries the report (--json).
    """
    try:
        with contextlib.redirect_stdout(sys.stderr or io.StringIO()):
            importlib.import_module(name)
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # SystemExit from a module's argparse counts too
        return one_line(exc)
    return None


def patch_modules():
    """{patch name: modules it waits for}; empty when the patch list cannot load."""
    try:
        from ascend_shim.patches import PATCHES
    except Exception:
        return {}
    return {p.name: tuple(p.modules) for p in PATCHES}


def disabled(name):
    """Whether ASCEND_SHIM_DISABLE leaves the patch ``name`` out (decided or not yet)."""
    try:
        from ascend_shim.startup import config as _config

        return bool(_config.get().patch_disabled(name))
    except Exception:
        return False


def waiting_for(row, modules):
    """The modules a pending patch still waits for (its target when unknown);
    none for a patch ASCEND_SHIM_DISABLE leaves out."""
    if row.get("state") != "pending" or disabled(row["name"]):
        return []
    needed = modules.get(row["name"], (row["target"],))
    return [m for m in needed if m not in sys.modules]


def follow_up(imported, rows, modules):
    """Modules under the roots of ``imported`` that pending patches still wait for."""
    roots = {name.partition(".")[0] for name in imported}
    wanted = []
    for row in rows:
        for name in waiting_for(row, modules):
            if name.partition(".")[0] in roots and name not in sys.modules and name not in wanted:
                wanted.append(name)
    return wanted


def import_all(names, modules, status):
    """Import what was asked, then what the pending patches need; report each."""
    report: Dict[str, Dict[str, Any]] = {"asked": {}, "followed": {}}
    for name in names:
        report["asked"][name] = import_one(name)
    import ascend_shim
    from ascend_shim.cli import activation

    if ascend_shim.withdrawn() or activation.switched_off() is not None:
        return report  # the shim left the import path, or is off: no patch waits for anything here
    done = [n for n, error in report["asked"].items() if error is None]
    for name in follow_up(done, status()["patches"], modules):
        error = import_one(name)
        if error and absent_here(name, error):
            error = NOT_THERE
        report["followed"][name] = error
    return report


def absent_here(name, error):
    """Whether ``error`` says this ComfyUI has no ``name``: the module, or a package above it
    (a release without ``comfy.ldm.minimax`` has no ``comfy.ldm.minimax.vae`` either)."""
    if not error.startswith("ModuleNotFoundError: No module named '"):
        return False
    missing = error[len("ModuleNotFoundError: No module named '"):].partition("'")[0]
    return name == missing or name.startswith(missing + ".")


def failed(imports):
    return [(n, e) for part in ("asked", "followed") for n, e in imports[part].items()
            if e is not None and e != NOT_THERE]
