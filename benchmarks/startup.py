"""What the shim costs every interpreter of the venv: ``python -c pass``.

Three setups, measured alternately in one run so machine noise hits all of
them alike:
  enabled        shim installed, default settings
  disabled       shim installed, ASCEND_SHIM=0
  not installed  the same venv without the shim
Prints the medians and the ratio enabled / not installed (target <= 1.03).

Both venvs hold setuptools, as every ComfyUI venv does (torch requires it on
Python 3.12+; ``python -m venv`` adds it up to 3.11): its
distutils-precedence.pth already makes Python decode a .pth file and import
a module from site-packages at every start, so the figure is what the shim
adds to a real venv. ``--bare`` compares against venvs with no .pth at all,
where the shim also pays those two first-time costs.

    python benchmarks/startup.py [--runs 100] [--python /path/to/python3] [--bare]
"""

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

import harness  # noqa: E402


def timed(python, env):
    start = time.perf_counter()
    subprocess.run([str(python), "-c", "pass"], env=env, check=True)
    return time.perf_counter() - start


def align_setuptools(python, bare):
    """Give the venv setuptools (what a ComfyUI venv has), or take it away (--bare)."""
    if bare:
        command = [str(python), "-m", "pip", "uninstall", "-q", "-y", "setuptools"]
    else:
        command = [str(python), "-m", "pip", "install", "-q", "setuptools"]
    harness.run(command, harness.scrubbed_env(), Path(str(python)).parent, check=True)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=100)
    parser.add_argument("--bare", action="store_true", help="venvs without setuptools (no other .pth)")
    parser.add_argument("--python", default=harness.pyenv_pythons().get("3.11", sys.executable))
    options = parser.parse_args(argv)

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        wheel = harness.build_wheel(tmp / "wheel")
        shim = harness.make_venv(options.python, tmp / "shim", wheel)
        plain = tmp / "plain"
        harness.run([options.python, "-m", "venv", str(plain)], harness.scrubbed_env(), tmp, check=True)
        for venv_python in (shim, plain / "bin" / "python"):
            align_setuptools(venv_python, bare=options.bare)
        setups = {
            "enabled": (shim, harness.scrubbed_env()),
            "disabled": (shim, harness.scrubbed_env(ASCEND_SHIM="0")),
            "not installed": (plain / "bin" / "python", harness.scrubbed_env()),
        }
        for python, env in setups.values():  # warm the page cache
            timed(python, env)
        samples = {name: [] for name in setups}
        for _ in range(options.runs):
            for name, (python, env) in setups.items():
                samples[name].append(timed(python, env))

    version = subprocess.run([options.python, "--version"], capture_output=True, text=True).stdout.strip()
    print("python -c pass, %s, %d runs each, alternating, %s" % (
        version, options.runs, "bare venvs" if options.bare else "venvs with setuptools"))
    medians = {name: statistics.median(values) * 1000 for name, values in samples.items()}
    for name, value in medians.items():
        print("  %-14s median %6.2f ms" % (name, value))
    ratio = medians["enabled"] / medians["not installed"]
    print("  ratio enabled / not installed: %.3f (target <= 1.03)" % ratio)
    return 0


if __name__ == "__main__":
    os.environ.pop("ASCEND_SHIM", None)
    sys.exit(main())
