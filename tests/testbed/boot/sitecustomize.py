"""Testbed boot: ``PYTHONPATH=tests/testbed/boot ASCEND_TESTBED=<kind> python ...``.

With ``ASCEND_TESTBED`` set to a machine kind (see testbed/machine.py) this puts
tests/ on sys.path, imports torch and activates that machine before any user
code runs; a failure to do so ends the interpreter (exit 70) rather than let a
test run on the wrong machine.  Either way it then runs the next
``sitecustomize`` found on sys.path *after* this folder (the project's own one,
say), so both work.  It may itself be exec'd by another sitecustomize's chain,
hence only ``__file__`` is relied on.
"""

import os
import sys


def _testbed_boot():
    kind = os.environ.get("ASCEND_TESTBED", "").strip()
    if not kind:
        return
    tests_dir = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    if tests_dir not in sys.path:
        sys.path.append(tests_dir)
    os.environ.setdefault("TORCH_DEVICE_BACKEND_AUTOLOAD", "0")
    try:
        from testbed import machine

        machine.activate(kind)
    except BaseException:
        import traceback

        sys.stderr.write("testbed boot: cannot activate machine %r:\n" % (kind,))
        traceback.print_exc()
        sys.stderr.flush()
        os._exit(70)


def _testbed_chain():
    # The frozen importlib modules are loaded already: chaining imports nothing new.
    import _frozen_importlib
    import _frozen_importlib_external

    here = os.path.realpath(os.path.dirname(os.path.abspath(__file__)))
    resolved = [os.path.realpath(os.path.abspath(entry or os.getcwd())) for entry in sys.path]
    # Only look further down sys.path: chaining backwards could loop.
    start = resolved.index(here) + 1 if here in resolved else 0
    rest = [sys.path[i] for i in range(start, len(sys.path)) if resolved[i] != here]
    spec = _frozen_importlib_external.PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None:
        return
    if spec.origin and os.path.realpath(spec.origin) == os.path.realpath(os.path.abspath(__file__)):
        return
    module = _frozen_importlib.module_from_spec(spec)
    previous = sys.modules.get("sitecustomize")
    sys.modules["sitecustomize"] = module  # the module runs under its own name
    try:
        spec.loader.exec_module(module)
    except Exception:
        import traceback

        sys.stderr.write("testbed boot: the next sitecustomize (%s) failed:\n" % (spec.origin,))
        traceback.print_exc()
    finally:
        # Imported by site.py: the chained module takes our place.  Exec'd by
        # another sitecustomize's chain: leave that one registered.
        mine = os.path.realpath(os.path.abspath(__file__))
        prev_file = getattr(previous, "__file__", None)
        if previous is not None and prev_file and os.path.realpath(prev_file) != mine:
            sys.modules["sitecustomize"] = previous


_testbed_boot()
_testbed_chain()
