"""No-install mode: ``PYTHONPATH=<this checkout> python main.py``.

For venvs where the shim cannot be pip-installed, or was installed with
``pip install --target`` (site-packages on PYTHONPATH never runs ``.pth``
files). Activates the same ``init()`` as the ``.pth``, then runs the next
``sitecustomize`` on sys.path so an existing one still works.
"""

import os
import sys


def _say(text):
    stream = sys.stderr  # a daemon may have none
    if stream is not None:
        try:
            stream.write("ascend_shim: %s\n" % text)
        except Exception:
            pass


def _activate():
    try:
        import ascend_shim

        ascend_shim.init()
    except Exception as exc:  # never stop the interpreter from starting
        _say("not activated: %r" % (exc,))


def _chain_next():
    from ascend_shim import _sitecustomize_chain

    _sitecustomize_chain.run_next(__file__)


_activate()
try:
    _chain_next()
except Exception as exc:
    _say("the next sitecustomize failed: %r" % (exc,))
