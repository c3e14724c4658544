"""Process-boundary test helpers: wheels, fresh venvs, scrubbed subprocesses.

The shim is tested the way users meet it: the wheel is built, installed into
a fresh venv, and each check starts a fresh interpreter with a scrubbed
environment. Downloads (wrapt wheels per Python, comfy-kitchen releases) go
to ``.cache/`` so ``tests/run.sh`` can fetch them once up front.
"""

import json
import os
import subprocess
import sys
import sysconfig
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TESTS = REPO / "tests"
TESTBED = TESTS / "testbed"
BOOT = TESTBED / "boot"
COMFY_FAKES = TESTBED / "comfy_fakes"
CACHE = Path(os.environ.get("ASCEND_SHIM_TEST_CACHE", REPO / ".cache"))

# every comfy-kitchen release the INT8 tests run against
KITCHEN_VERSIONS = ("0.2.11", "0.2.19", "0.2.22", "0.2.23", "0.2.26", "0.2.27", "0.2.34", "0.2.36", "0.2.40")
STARTUP_PYTHONS = ("3.10", "3.11", "3.12", "3.13")

# modules that must stay out of an interpreter where nothing targeted loaded
HEAVY = ("wrapt", "threading", "importlib.util", "importlib.metadata", "torch", "torch_npu",
         "logging", "asyncio")


def pyenv_pythons():
    """{"3.11": "/root/.pyenv/versions/3.11.7/bin/python3", ...} for those installed."""
    root = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv")) / "versions"
    found = {}
    if root.is_dir():
        for folder in sorted(root.iterdir()):
            for minor in STARTUP_PYTHONS:
                exe = folder / "bin" / "python3"
                if folder.name.startswith(minor + ".") and exe.exists():
                    found[minor] = str(exe)
    return found


def scrubbed_env(**extra):
    """A minimal environment: no PYTHON*, no ASCEND_SHIM*, no torch autoload."""
    env = {k: os.environ[k] for k in ("PATH", "HOME", "LANG", "LC_ALL", "TMPDIR") if k in os.environ}
    env["TORCH_DEVICE_BACKEND_AUTOLOAD"] = "0"
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    for key, value in extra.items():
        if value is not None:
            env[key] = str(value)
    return env


def run(args, env, cwd, timeout=300, check=False):
    proc = subprocess.run(args, env=env, cwd=str(cwd), capture_output=True, text=True,
                          timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError("command failed (%d): %s\nstdout:\n%s\nstderr:\n%s"
                             % (proc.returncode, " ".join(map(str, args)), proc.stdout, proc.stderr))
    return proc


def last_json(proc):
    """The JSON object a test script printed on its last stdout line."""
    lines = [line for line in proc.stdout.splitlines() if line.strip()]
    if proc.returncode != 0 or not lines:
        raise AssertionError("script failed (%d)\nstdout:\n%s\nstderr:\n%s"
                             % (proc.returncode, proc.stdout, proc.stderr))
    return json.loads(lines[-1])


def build_wheel(outdir):
    """Build the shim wheel with the running interpreter (hatchling installed)."""
    outdir.mkdir(parents=True, exist_ok=True)
    run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
         "--no-index", "-w", str(outdir), str(REPO)], scrubbed_env(), REPO, check=True)
    (wheel,) = outdir.glob("ascend_shim-*.whl")
    return wheel


def wheelhouse_for(python):
    """A folder holding a wrapt wheel usable by ``python`` (downloaded if missing)."""
    house = CACHE / "wheelhouse"
    house.mkdir(parents=True, exist_ok=True)
    run([python, "-m", "pip", "download", "--only-binary=:all:", "--no-deps", "wrapt>=2.5",
         "-d", str(house), "--find-links", str(house)], scrubbed_env(), REPO, check=True)
    return house


def make_venv(python, dest, wheel, with_outer_site=False):
    """A fresh venv with the shim wheel installed offline; optionally seeing this
    interpreter's site-packages (torch, safetensors) through a path-only .pth."""
    house = wheelhouse_for(python)
    run([python, "-m", "venv", str(dest)], scrubbed_env(), REPO, check=True)
    vpython = dest / "bin" / "python"
    run([str(vpython), "-m", "pip", "install", "-q", "--no-index", "--find-links", str(house),
         str(wheel)], scrubbed_env(), REPO, check=True)
    if with_outer_site:
        site = Path(run([str(vpython), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                        scrubbed_env(), REPO, check=True).stdout.strip())
        outer = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
        (site / "zz_outer_site.pth").write_text("\n".join(sorted(outer)) + "\n")
    return vpython


def make_venv_editable(python, dest):
    """A fresh venv with the checkout installed by ``pip install -e`` (offline build)."""
    house = wheelhouse_for(python)
    run([python, "-m", "pip", "download", "-q", "-d", str(house), "--find-links", str(house),
         "hatchling>=1.19", "editables"], scrubbed_env(), REPO, check=True)
    run([python, "-m", "venv", str(dest)], scrubbed_env(), REPO, check=True)
    vpython = dest / "bin" / "python"
    run([str(vpython), "-m", "pip", "install", "-q", "--no-index", "--find-links", str(house),
         "hatchling", "editables", "wrapt"], scrubbed_env(), REPO, check=True)
    run([str(vpython), "-m", "pip", "install", "-q", "--no-index", "--no-build-isolation",
         "-e", str(REPO)], scrubbed_env(), REPO, check=True)
    return vpython


def kitchen_dir(version):
    """comfy-kitchen ``version`` from PyPI, installed into its own target folder."""
    target = CACHE / "kitchen" / version
    if not (target / "comfy_kitchen" / "__init__.py").exists():
        run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target),
             "comfy-kitchen==%s" % version], scrubbed_env(), REPO, check=True, timeout=900)
    return target


def bed_env(machine="ascend-cu130", comfy=None, kitchen=None, extra_path=(), **extra):
    """Environment of a subprocess on the simulated machine ``machine``.

    comfy    a fake ComfyUI shape under tests/testbed/comfy_fakes (or a real
             checkout's path); kitchen  a comfy-kitchen version
    """
    path = [str(BOOT), str(TESTS)]
    if comfy:
        path.append(str(comfy) if os.sep in str(comfy) else str(COMFY_FAKES / comfy))
    if kitchen:
        path.append(str(kitchen_dir(kitchen)))
    path.extend(str(p) for p in extra_path)
    env = scrubbed_env(PYTHONPATH=os.pathsep.join(path), **extra)
    if machine:
        env["ASCEND_TESTBED"] = machine
    return env


def torch_available():
    try:
        import torch  # noqa: F401
    except Exception:
        return False
    return True
