"""The simulated machines by hand, with the python of any venv that has torch.

From the checkout root (``python -m testbed ...`` from tests/ works too):

  eval "$(python tests/testbed env KIND)"     this shell becomes a KIND machine
  python tests/testbed run KIND -- CMD ...    one command on a KIND machine
  python tests/testbed comfyui VERSION        the folder of a real ComfyUI release

``env`` and ``run`` put the boot folder, tests/ and the checkout root (the
shim's no-install mode) first on PYTHONPATH; with ``--installed`` (``env
--installed KIND``) the checkout stays off it, so the shim the venv has
installed runs (or none, after an uninstall). In ``run``, a CMD of ``python``
or ``python3`` is this very interpreter, whatever PATH says.
"""

import os
import shlex
import sys

TESTS_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ROOT = os.path.dirname(TESTS_DIR)
if __package__ != "testbed":  # run as a folder: import the bed as "testbed", never twice
    if sys.path and os.path.abspath(sys.path[0]) == os.path.join(TESTS_DIR, "testbed"):
        del sys.path[0]
    sys.path.insert(0, TESTS_DIR)

from testbed import machine  # noqa: E402

USAGE = """usage: python tests/testbed env [--installed] KIND            (eval its output: this shell becomes KIND)
       python tests/testbed run [--installed] KIND -- CMD ...    (python in CMD: this interpreter)
       python tests/testbed comfyui VERSION                      (prints the folder of that real ComfyUI)
kinds: %s (ascend-cu130: the users' box, a CUDA-build torch without a driver, torch_npu, one 910B3)
--installed: run the shim this venv has installed (pip install .), not the checkout's copy
TESTBED_NPU_COUNT=N: N simulated cards on the ascend machines (default 1; 0: torch_npu sees none)
An emulated NPU: every op runs on the host CPU; the shim's code is unchanged on it.
""" % ", ".join(machine.KINDS)


def _env(kind: str, base: dict, installed: bool = False) -> dict:
    return machine.subprocess_env(kind, env=base, pythonpath=() if installed else (ROOT,))


def main(argv=None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] in ("-h", "--help", "help"):
        sys.stdout.write(USAGE)
        return 0
    installed = len(args) > 1 and args[1] == "--installed"
    if installed:
        del args[1]
    if len(args) == 2 and args[0] == "env" and args[1] in machine.KINDS:
        env = _env(args[1], {}, installed)
        print("export ASCEND_TESTBED=%s" % shlex.quote(env["ASCEND_TESTBED"]))
        print("export TORCH_DEVICE_BACKEND_AUTOLOAD=%s" % shlex.quote(env["TORCH_DEVICE_BACKEND_AUTOLOAD"]))
        print('export PYTHONPATH=%s"${PYTHONPATH:+:$PYTHONPATH}"' % shlex.quote(env["PYTHONPATH"]))
        return 0
    if len(args) >= 4 and args[0] == "run" and args[1] in machine.KINDS and args[2] == "--":
        command = args[3:]
        if command[0] in ("python", "python3"):
            command[0] = sys.executable
        os.execvpe(command[0], command, _env(args[1], dict(os.environ), installed))
    if len(args) == 2 and args[0] == "comfyui":
        import harness

        if args[1] not in harness.COMFYUI_RELEASES:
            sys.stderr.write("no such ComfyUI release here; known: %s\n" % ", ".join(harness.COMFYUI_VERSIONS))
            return 2
        print(harness.comfyui_dir(args[1]))
        return 0
    sys.stderr.write(USAGE)
    return 2


if __name__ == "__main__":
    sys.exit(main())
