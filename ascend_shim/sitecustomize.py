"""Catches ``PYTHONPATH=<checkout>/ascend_shim``: the shim is not active then.

No-install mode needs the checkout ROOT on PYTHONPATH (the folder holding
``sitecustomize.py`` and ``ascend_shim/``). Pointed at the package folder
itself, Python finds this file instead: it says so once on stderr, then runs
the next ``sitecustomize`` on sys.path so an existing one still works.
Never part of the wheel.
"""

import os
import sys


def _warn():
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


def _run_next():
    here = os.path.dirname(os.path.abspath(__file__))
    folders = [os.path.abspath(entry or os.getcwd()) for entry in sys.path]
    for folder in folders[folders.index(here) + 1:] if here in folders else []:
        candidate = os.path.join(folder, "sitecustomize.py")
        if folder != here and os.path.isfile(candidate):
            with open(candidate, "rb") as handle:
                code = compile(handle.read(), candidate, "exec")
            exec(code, {"__name__": "sitecustomize", "__file__": candidate})
            return


_warn()
try:
    _run_next()
except Exception as exc:
    if sys.stderr is not None:
        try:
            sys.stderr.write("ascend_shim: the next sitecustomize failed: %r\n" % (exc,))
        except Exception:
            pass
