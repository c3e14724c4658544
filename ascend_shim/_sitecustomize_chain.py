"""Run the next ``sitecustomize`` on sys.path: one sitecustomize must not hide another.

Python imports only the first ``sitecustomize`` it finds. Ours (no-install
mode, the checkout root's; the package-folder warning) call ``run_next`` so
that one already in the venv or further down PYTHONPATH still runs. Only
entries after the caller's folder are searched: chaining backwards could loop.

Imported as ``ascend_shim._sitecustomize_chain`` from the checkout root, and
as the top-level ``_sitecustomize_chain`` when PYTHONPATH wrongly names the
package folder itself; it therefore imports nothing of the shim.
"""

import os
import sys


def _resolved(entry):
    return os.path.realpath(os.path.abspath(entry or os.getcwd()))


def _next_spec(mine):
    """The spec of the first ``sitecustomize`` after the folder of ``mine`` (a
    resolved path), or None."""
    # loaded already at startup: finding and loading import nothing new
    import _frozen_importlib_external

    here = os.path.dirname(mine)
    resolved = [_resolved(entry) for entry in sys.path]
    if here not in resolved:
        return None
    rest = [sys.path[i] for i in range(resolved.index(here) + 1, len(sys.path)) if resolved[i] != here]
    spec = _frozen_importlib_external.PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None:
        return None
    if spec.origin and os.path.realpath(spec.origin) == mine:
        return None
    return spec


# the sitecustomize files that chained on (read by ``ascend_shim.cli.activation``:
# sys.modules["sitecustomize"] names the last one only)
callers: list[str] = []


def run_next(caller_file):
    """Execute the next ``sitecustomize`` as the module ``sitecustomize``; its errors propagate.

    Afterwards ``sys.modules["sitecustomize"]`` is the module that ran, unless
    the caller was itself run by another's chain: that one stays registered.
    """
    import _frozen_importlib

    mine = os.path.realpath(os.path.abspath(caller_file))
    callers.append(os.path.abspath(caller_file))
    spec = _next_spec(mine)
    if spec is None:
        return None
    module = _frozen_importlib.module_from_spec(spec)
    previous = sys.modules.get("sitecustomize")
    sys.modules["sitecustomize"] = module
    try:
        spec.loader.exec_module(module)
    finally:
        previous_file = getattr(previous, "__file__", None)
        if previous is not None and previous_file and os.path.realpath(previous_file) != mine:
            sys.modules["sitecustomize"] = previous
    return spec.origin
