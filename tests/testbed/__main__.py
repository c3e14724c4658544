"""``python -m testbed env <kind>``: shell exports that boot a simulated machine.

``python -m testbed run <kind> -- <command ...>``: run a command on that machine.
"""

import os
import shlex
import sys

from testbed import machine


def main(argv=None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) >= 2 and args[0] == "env":
        env = machine.subprocess_env(args[1], env={})
        for key in ("ASCEND_TESTBED", "PYTHONPATH", "TORCH_DEVICE_BACKEND_AUTOLOAD"):
            print(f"export {key}={shlex.quote(env[key])}")
        return 0
    if len(args) >= 4 and args[0] == "run" and args[2] == "--":
        env = machine.subprocess_env(args[1])
        os.execvpe(args[3], args[3:], env)
    sys.stderr.write(
        "usage: python -m testbed env <kind>\n"
        "       python -m testbed run <kind> -- <command ...>\n"
        f"kinds: {', '.join(machine.KINDS)}\n"
    )
    return 2


if __name__ == "__main__":
    sys.exit(main())
