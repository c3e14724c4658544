"""Process-boundary test helpers: wheels, fresh venvs, scrubbed subprocesses.

The shim is tested the way users meet it: the wheel is built, installed into
a fresh venv, and each check starts a fresh interpreter with a scrubbed
environment. Downloads (wrapt wheels per Python, comfy-kitchen releases) go
to ``.cache/`` so ``tests/run.sh`` can fetch them once up front.
"""

import hashlib
import json
import os
import shutil
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

# the real ComfyUI releases the suite runs, with the upstream commit of each
# (the commit that set comfyui_version.py to it; 0.29.0/0.30.0: master commits)
COMFYUI_RELEASES = {
    "0.3.10": "9c773a241b446c7abb0cfabe1d292746251fed73",
    "0.3.14": "debabccb847b24e6be7cf69deb9c66026364cb04",
    "0.3.45": "9a470e073e2742d4edd6e7ea1ce28d861a77d9c4",
    "0.3.68": "265adad858e1f31b66cd3523a02b16f5d34ced52",
    "0.15.1": "3dd10a59c00248d00f0cb0ab794ff1bb9fb00a5f",
    "0.27.0": "bb131be9e83d2f773c90f1d6f1e4b248a498c8c5",
    "0.29.0": "4f874c5e3a2fafb9938273c5f3fc47d2da017667",
    "0.30.0": "6db4fa2fcd38a92d4e0364c917cd8503620e2a74",
}
COMFYUI_VERSIONS = tuple(COMFYUI_RELEASES)
COMFYUI_GIT = "https://github.com/comfyanonymous/ComfyUI"

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


def comfyui_sources():
    """Folders that may hold ``ComfyUI-<version>.tar.xz``, in the order searched."""
    folders = [os.environ.get("ASCEND_SHIM_COMFYUI_SOURCES"), REPO.parent / "shared" / "upstream"]
    return [Path(folder) for folder in folders if folder]


def _verified(archive):
    """True when ``archive`` matches its line in a SHA256SUMS beside it (or there is none)."""
    sums = archive.parent / "SHA256SUMS"
    if not sums.exists():
        return True
    for line in sums.read_text().splitlines():
        digest, _, name = line.partition("  ")
        if name.strip() == archive.name:
            return hashlib.sha256(archive.read_bytes()).hexdigest() == digest
    return True


def comfyui_dir(version):
    """A real ComfyUI source tree at ``version``, unpacked once into ``.cache/comfyui``.

    From ``ComfyUI-<version>.tar.xz`` in ``comfyui_sources()``, failing that a
    clone of the pinned upstream commit. The tree is a test input: it is
    never copied into the project.
    """
    root = CACHE / "comfyui"
    tree = root / ("ComfyUI-%s" % version)
    if (tree / "comfy" / "model_management.py").exists():
        return tree
    root.mkdir(parents=True, exist_ok=True)
    partial = root / (".partial-%s-%d" % (version, os.getpid()))
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir()
    for folder in comfyui_sources():
        archive = folder / ("ComfyUI-%s.tar.xz" % version)
        if archive.exists():
            if not _verified(archive):
                raise AssertionError("%s does not match its SHA256SUMS" % archive)
            run(["tar", "-xJf", str(archive), "-C", str(partial)], scrubbed_env(), REPO, check=True)
            break
    else:
        commit = COMFYUI_RELEASES[version]
        clone = partial / tree.name
        run(["git", "init", "-q", str(clone)], scrubbed_env(), REPO, check=True)
        run(["git", "-C", str(clone), "fetch", "-q", "--depth", "1", COMFYUI_GIT, commit],
            scrubbed_env(), REPO, check=True, timeout=900)
        run(["git", "-C", str(clone), "checkout", "-q", "FETCH_HEAD"], scrubbed_env(), REPO, check=True)
    try:
        os.replace(partial / tree.name, tree)  # atomic: a parallel worker may have won
    except OSError:
        if not (tree / "comfy" / "model_management.py").exists():
            raise
    shutil.rmtree(partial, ignore_errors=True)
    return tree


# the real torch_npu releases the fake is held to: the users' and the newest
TORCH_NPU_VERSIONS = ("2.12.0", "2.14.0")
# the Python API sources tests/testbed/test_real_signatures.py reads from each wheel
TORCH_NPU_SOURCES = ("torch_npu/__init__.py", "torch_npu/version.py", "torch_npu/npu/", "torch_npu/utils/")
# strings kept from libtorch_npu.so: the op schemas it registers (``TORCH_LIBRARY``
# text), its kernel wrappers (``wrapper_NPU__mm``: which aten ops have an NPU
# kernel) and the CPU-fallback warning's pieces
TORCH_NPU_STRINGS = {
    "registered_schemas.txt": rb"[A-Za-z_][\w.]*\(.*\) -> .+",
    "kernel_wrappers.txt": rb"wrapper_\w+",
    "fallback_messages.txt": rb".*(?:CAUTION|fall ?back|not currently supported|performance implications).*",
}


def torch_npu_dir(version):
    """What the tests read from the real torch_npu ``version``, kept in ``.cache``.

    The x86_64 wheel (about 40 MB; it installs there but cannot import
    without CANN) is downloaded once; only ``TORCH_NPU_SOURCES`` and the
    ``TORCH_NPU_STRINGS`` of its library (together about 1 MB) are kept.
    Works offline once unpacked.
    """
    import re
    import zipfile

    target = CACHE / "torch_npu" / version
    done = target / "WHEEL_NAME"
    if done.exists():
        return target
    download = CACHE / "torch_npu" / (".download-%s-%d" % (version, os.getpid()))
    shutil.rmtree(download, ignore_errors=True)
    run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
         "--python-version", "3.13", "--implementation", "cp", "--abi", "cp313",
         "--platform", "manylinux_2_28_x86_64", "-d", str(download), "torch-npu==%s" % version],
        scrubbed_env(), REPO, check=True, timeout=900)
    (wheel,) = download.glob("torch_npu-*.whl")
    partial = download / "unpacked"
    with zipfile.ZipFile(wheel) as archive:
        for name in archive.namelist():
            if name.endswith(".py") and name.startswith(TORCH_NPU_SOURCES):
                archive.extract(name, partial)
        strings = re.findall(rb"[\x20-\x7e]{8,}", archive.read("torch_npu/lib/libtorch_npu.so"))
    for filename, pattern in TORCH_NPU_STRINGS.items():
        kept = sorted({text.decode() for text in strings if re.fullmatch(pattern, text)})
        (partial / filename).write_text("".join(line + "\n" for line in kept))
    (partial / "WHEEL_NAME").write_text(wheel.name + "\n")
    try:
        os.replace(partial, target)  # atomic: a parallel worker may have won
    except OSError:
        if not done.exists():
            raise
    shutil.rmtree(download, ignore_errors=True)
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
