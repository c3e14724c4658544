"""Catches ``PYTHONPATH=<checkout>/ascend_shim``: the shim is not active then.

No-install mode needs the checkout ROOT on PYTHONPATH (the folder holding
``sitecustomize.py`` and ``ascend_shim/``). Pointed at the package folder
itself, Python finds this file instead: it says so once on stderr, then runs
the next ``sitecustomize`` on sys.path so an existing one still works.
Never part of the wheel.
"""

import os
import sys


def _shim_active():
    # the .pth of an installed shim ran before any sitecustomize: the package
    # is loaded then, and answers itself (nothing is imported from here)
    installed = getattr(sys.modules.get("ascend_shim"), "finder_installed", None)
    return installed is not None and installed()


def _warn():
    if _shim_active():
        return  # installed and active: this folder on PYTHONPATH changes nothing
    here = os.path.dirname(os.path.abspath(__file__))
    stream = sys.stderr  # a daemon may have none
    if stream is None:
        return
    try:
        stream.write("ascend_shim: NOT active: PYTHONPATH points at the package folder %s; "
                     "point it at the checkout root instead: PYTHONPATH=%s\n"
                     % (here, os.path.dirname(here)))
    except Exception:
        pass


_warn()
try:
    import _sitecustomize_chain  # beside this file, so on sys.path as a top-level module

    _sitecustomize_chain.run_next(__file__)
except Exception as exc:
    if sys.stderr is not None:
        try:
            sys.stderr.write("ascend_shim: the next sitecustomize failed: %r\n" % (exc,))
        except Exception:
            pass
