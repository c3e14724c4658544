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


def _ray_system_process():
    """Ray's own processes (dashboard, agents, log monitor, autoscaler monitor) inherit the
    driver's environment: they are not the machine's programs, and importing torch in each
    of them makes a Ray node miss its start-up deadline on two cores. Ray's workers
    (default_worker.py) run the user's code: they become the machine."""
    script = (sys.argv[0] if getattr(sys, "argv", None) else "").replace(os.sep, "/")
    return "/ray/" in script and not script.endswith("/ray/_private/workers/default_worker.py")


def _testbed_boot():
    kind = os.environ.get("ASCEND_TESTBED", "").strip()
    if not kind or _ray_system_process():
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
    # the project's own chaining (ascend_shim._sitecustomize_chain.py), loaded
    # by path: the shim need not be importable here. The frozen importlib
    # modules are loaded already, so this imports nothing new.
    import _frozen_importlib
    import _frozen_importlib_external

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    path = os.path.join(root, "ascend_shim", "_sitecustomize_chain.py")
    spec = _frozen_importlib_external.spec_from_file_location("_testbed_sitecustomize_chain", path)
    chain = _frozen_importlib.module_from_spec(spec)
    spec.loader.exec_module(chain)
    try:
        chain.run_next(__file__)
    except Exception:
        import traceback

        sys.stderr.write("testbed boot: the next sitecustomize failed:\n")
        traceback.print_exc()


_testbed_boot()
_testbed_chain()
