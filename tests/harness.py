"""Process-boundary test helpers: wheels, fresh venvs, scrubbed subprocesses.

The shim is tested the way users meet it: the wheel is built, installed into
a fresh venv, and each check starts a fresh interpreter with a scrubbed
environment. Downloads (wrapt wheels per Python, comfy-kitchen releases) go
to ``.cache/`` so ``tests/run.sh`` can fetch them once up front.
"""

import hashlib
import json
import os
import re
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
# (0.2.31, v0.33.0's pin, is not among them: every run of v0.33.0 installs it, the INT8 layers too)
KITCHEN_VERSIONS = ("0.2.11", "0.2.19", "0.2.22", "0.2.23", "0.2.26", "0.2.27", "0.2.34", "0.2.36", "0.2.40")
# ASCEND_SHIM_TEST_KITCHENS="0.2.26 0.2.40" runs some of them (tests/run.sh: the users' pin and the
# newest, on the users' Python and torch; the whole matrix runs on the other suite)
_ONLY = os.environ.get("ASCEND_SHIM_TEST_KITCHENS", "").replace(",", " ").split()
if _ONLY:
    if set(_ONLY) - set(KITCHEN_VERSIONS):
        raise ValueError("ASCEND_SHIM_TEST_KITCHENS names releases outside the matrix: %s"
                         % ", ".join(sorted(set(_ONLY) - set(KITCHEN_VERSIONS))))
    KITCHEN_VERSIONS = tuple(v for v in KITCHEN_VERSIONS if v in _ONLY)
STARTUP_PYTHONS = ("3.10", "3.11", "3.12", "3.13")

# the real ComfyUI trees the suite runs, oldest first, with the upstream commit of each (the
# commit that set comfyui_version.py to it; 0.29.0: a master commit; v0.30.0 and v0.33.0: the
# release tags, named as their archives are). Each is found as ComfyUI-<name>.tar.xz.
COMFYUI_RELEASES = {
    "0.3.10": "9c773a241b446c7abb0cfabe1d292746251fed73",
    "0.3.14": "debabccb847b24e6be7cf69deb9c66026364cb04",
    "0.3.45": "9a470e073e2742d4edd6e7ea1ce28d861a77d9c4",
    "0.3.68": "265adad858e1f31b66cd3523a02b16f5d34ced52",
    "0.15.1": "3dd10a59c00248d00f0cb0ab794ff1bb9fb00a5f",
    "0.27.0": "bb131be9e83d2f773c90f1d6f1e4b248a498c8c5",
    "0.29.0": "4f874c5e3a2fafb9938273c5f3fc47d2da017667",
    "v0.30.0": "b1693ecba9f5b65f8c80ab36b195ab963ec92413",
    "v0.33.0": "2f35f4a08176d993cded35dac3332be4f7287f41",
}
COMFYUI_VERSIONS = tuple(COMFYUI_RELEASES)
# the release the users run (the seed's 0.30.2 has its MiniMax-H3 file byte for byte; it pins
# comfy-kitchen 0.2.26, the users' own) and the newest release at hand (pins 0.2.31)
COMFYUI_USER = "v0.30.0"
COMFYUI_NEWEST = COMFYUI_VERSIONS[-1]
# the comfy-kitchen each pins (requirements.txt; tests/test_versions.py holds them to it)
COMFYUI_USER_KITCHEN = "0.2.26"
COMFYUI_NEWEST_KITCHEN = "0.2.31"
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


_CACHE_HOMES = []


def fresh_cache_home():
    """A path no other child was given (not created: a child that writes creates it)."""
    if not _CACHE_HOMES:
        import tempfile

        _CACHE_HOMES.append(tempfile.mkdtemp(prefix="ascend_shim-test-cache-"))
    _CACHE_HOMES.append(None)
    return os.path.join(_CACHE_HOMES[0], str(len(_CACHE_HOMES)))


def scrubbed_env(**extra):
    """A minimal environment: no PYTHON*, no ASCEND_SHIM*, no torch autoload.

    The thread setting the run gave (``OMP_NUM_THREADS``, set by ``tests/run.sh``)
    is kept: on a 2-core runner, two test workers whose children each start two
    torch threads spin against each other."""
    env = {k: os.environ[k] for k in ("PATH", "HOME", "LANG", "LC_ALL", "TMPDIR", "OMP_NUM_THREADS")
           if k in os.environ}
    env["TORCH_DEVICE_BACKEND_AUTOLOAD"] = "0"
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    # what the shim keeps for status/doctor (engine/kept.py) starts empty in every child, never
    # the user's ~/.cache; a test that reads it back passes its own XDG_CACHE_HOME to both
    env["XDG_CACHE_HOME"] = fresh_cache_home()
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


def ranks_json(procs, timeout):
    """The last stdout line of each started process (a rank each, in order) as JSON; a rank that
    fails fails the caller with its stderr, and none is left running."""
    results = []
    try:
        for rank, proc in enumerate(procs):
            stdout, stderr = proc.communicate(timeout=timeout)
            assert proc.returncode == 0, "rank %d failed:\n%s" % (rank, stderr[-4000:])
            results.append(json.loads(stdout.strip().splitlines()[-1]))
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
    return results


def raylight_ranks(python, folder, script, raylight="1.7.2", extra_path=(), timeout=240, cards=(1, 3), box=4,
                   **env):
    """``script`` as ranks of raylight's workers on the users' box, side by side: fresh
    interpreters of ``python`` on ``cards`` of ``box`` (cards 1 and 3 of 4 unless told;
    ``ASCEND_RT_VISIBLE_DEVICES``, as Ray gives a worker its card), ComfyUI v0.30.0 and its kitchen
    and raylight's src on the path; each finds its rank in ``RANK``, the world's size in ``WORLD``
    and a file store at ``STORE``. Their JSON lines, in rank order (``ranks_json``)."""
    path = Path(folder) / "rank.py"
    path.write_text(script)
    procs = []
    for rank, card in enumerate(cards):
        environment = bed_env(
            "ascend-cu130", comfyui_dir(COMFYUI_USER), COMFYUI_USER_KITCHEN,
            extra_path=(raylight_dir(raylight) / "src", *extra_path), TESTBED_NPU_COUNT=str(box),
            ASCEND_RT_VISIBLE_DEVICES=str(card), RANK=str(rank), WORLD=str(len(cards)),
            STORE=str(Path(folder) / "store"), **env)
        procs.append(subprocess.Popen([str(python), str(path)], env=environment, cwd=str(folder),
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    return ranks_json(procs, timeout)


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


def pytest_asyncio_dir():
    """pytest-asyncio, which ComfyUI's tests-unit needs, in its own target folder: on the
    PYTHONPATH of those runs only, never a plugin of this suite's own pytest."""
    target = CACHE / "pytest-asyncio"
    if not (target / "pytest_asyncio" / "__init__.py").exists():
        run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target),
             "pytest-asyncio>=0.23"], scrubbed_env(), REPO, check=True, timeout=900)
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


def _unpacked(root, name, marker, fetch=None):
    """``root/name``, unpacked once from ``<name>.tar.xz`` in ``comfyui_sources()`` (failing that,
    ``fetch(folder)`` puts the tree in ``folder/name``); ``marker`` is a file every finished tree
    holds. A parallel worker may unpack the same tree: the rename is atomic, the loser's is dropped."""
    tree = root / name
    if (tree / marker).exists():
        return tree
    root.mkdir(parents=True, exist_ok=True)
    partial = root / (".partial-%s-%d" % (name, os.getpid()))
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir()
    for folder in comfyui_sources():
        archive = folder / ("%s.tar.xz" % name)
        if archive.exists():
            if not _verified(archive):
                raise AssertionError("%s does not match its SHA256SUMS" % archive)
            run(["tar", "-xJf", str(archive), "-C", str(partial)], scrubbed_env(), REPO, check=True)
            break
    else:
        if fetch is None:
            raise AssertionError("%s.tar.xz is in none of %s" % (name, comfyui_sources()))
        fetch(partial)
    try:
        os.replace(partial / name, tree)
    except OSError:
        if not (tree / marker).exists():
            raise
    shutil.rmtree(partial, ignore_errors=True)
    return tree


def comfyui_dir(version):
    """A real ComfyUI source tree at ``version``, unpacked once into ``.cache/comfyui``.

    From ``ComfyUI-<version>.tar.xz`` in ``comfyui_sources()``, failing that a
    clone of the pinned upstream commit. The tree is a test input: it is
    never copied into the project.
    """
    name = "ComfyUI-%s" % version

    def clone(folder):
        target = folder / name
        run(["git", "init", "-q", str(target)], scrubbed_env(), REPO, check=True)
        run(["git", "-C", str(target), "fetch", "-q", "--depth", "1", COMFYUI_GIT, COMFYUI_RELEASES[version]],
            scrubbed_env(), REPO, check=True, timeout=900)
        run(["git", "-C", str(target), "checkout", "-q", "FETCH_HEAD"], scrubbed_env(), REPO, check=True)

    return _unpacked(CACHE / "comfyui", name, Path("comfy") / "model_management.py", clone)


# raylight (komikndr/raylight: Ray + xDiT sequence parallel, a ComfyUI custom node), each release
# with the ComfyUI release it pairs with (1.7.2's MiniMax-H3 imports v0.30.0's audio sigma slope)
RAYLIGHT_RELEASES = {"1.7.2": "v0.30.0", "1.9.0": "v0.33.0"}


def raylight_dir(version):
    """raylight ``version``'s custom-node folder, unpacked once into ``.cache/raylight`` from
    ``raylight-<version>.tar.xz`` beside the ComfyUI archives (a test input, never copied)."""
    return _unpacked(CACHE / "raylight", "raylight-%s" % version, Path("src") / "raylight" / "nodes.py")


def free_port():
    """A TCP port nothing listens on now (a process group's rendezvous, one per test)."""
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def raylight_available():
    """Whether this interpreter has what raylight needs (tests/requirements-raylight.txt)."""
    import importlib.util

    return all(importlib.util.find_spec(name) is not None for name in ("ray", "yunchang", "xfuser"))


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


# what the simulated machine's judge reads from each wheel (tests/testbed/npu_registry.py):
# the codegen registry torch_npu builds its NPU kernels from, and every NUL-delimited string of
# libtorch_npu.so shaped like an aten overload name (``add.Tensor``, ``silu_``: the names its
# ``m.impl`` calls register). A cache folder of its own, beside ``torch_npu/<version>``.
TORCH_NPU_REGISTRY_KEY = "torch_npu_registry"
TORCH_NPU_CODEGEN_YAML = "torch_npu/csrc/aten/npu_native_functions_by_codegen.yaml"
_REGISTRATION_NAME = rb"(?<=\x00)[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z0-9_]+)?(?=\x00)"


def torch_npu_registry(version):
    """The folder the simulated machine reads torch_npu ``version``'s NPU kernel registry from.

    ``npu_native_functions_by_codegen.yaml`` (as in the wheel), ``registration_names.txt``
    (the op-name strings of ``libtorch_npu.so``, one a line) and ``WHEEL_NAME``; about
    300 KB, kept in ``.cache/torch_npu_registry/<version>``. The wheel is downloaded once.
    """
    import re
    import zipfile

    target = CACHE / TORCH_NPU_REGISTRY_KEY / version
    done = target / "WHEEL_NAME"
    if done.exists():
        return target
    download = CACHE / TORCH_NPU_REGISTRY_KEY / (".download-%s-%d" % (version, os.getpid()))
    shutil.rmtree(download, ignore_errors=True)
    run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
         "--python-version", "3.13", "--implementation", "cp", "--abi", "cp313",
         "--platform", "manylinux_2_28_x86_64", "-d", str(download), "torch-npu==%s" % version],
        scrubbed_env(), REPO, check=True, timeout=900)
    (wheel,) = download.glob("torch_npu-*.whl")
    partial = download / "unpacked"
    partial.mkdir()
    with zipfile.ZipFile(wheel) as archive:
        (partial / Path(TORCH_NPU_CODEGEN_YAML).name).write_bytes(archive.read(TORCH_NPU_CODEGEN_YAML))
        names = {name for name in re.findall(_REGISTRATION_NAME, archive.read("torch_npu/lib/libtorch_npu.so"))
                 if len(name) <= 80 and not name.startswith(b"_Z")}  # not a mangled C++ symbol
    (partial / "registration_names.txt").write_text("".join(n.decode() + "\n" for n in sorted(names)))
    (partial / "WHEEL_NAME").write_text(wheel.name + "\n")
    try:
        os.replace(partial, target)  # atomic: a parallel worker may have won
    except OSError:
        if not done.exists():
            raise
    shutil.rmtree(download, ignore_errors=True)
    return target


def _function_body(source, name):
    """The text of top-level ``def name`` in ``source`` ("" when there is none)."""
    match = re.search(r"^def %s\(.*?(?=^\S)" % re.escape(name), source + "\n.", re.S | re.M)
    return match.group(0) if match else ""


def comfyui_features(version):
    """What a real ComfyUI tree offers, read from its source (as the shim's guards see it).

    ascend          model_management knows the NPU (is_ascend_npu)
    bf16_npu        should_use_bf16 answers for the NPU itself (v0.3.15+)
    disable_mmap    comfy.utils.DISABLE_MMAP and --disable-mmap
    pin_memory, memory_summary, synchronize, device_list, nvfp4, mxfp8, int8_compute
                    the model_management function of that job exists
    quant_ops       comfy/quant_ops.py (comfy-kitchen); int8, w4a8: its INT8 / W4A8 formats
    """
    tree = comfyui_dir(version)
    mm = (tree / "comfy" / "model_management.py").read_text()
    utils = (tree / "comfy" / "utils.py").read_text()
    quant = tree / "comfy" / "quant_ops.py"
    quant_text = quant.read_text() if quant.exists() else ""
    functions = {"ascend": "is_ascend_npu", "pin_memory": "pin_memory", "memory_summary": "debug_memory_summary",
                 "synchronize": "synchronize", "device_list": "get_all_torch_devices",
                 "nvfp4": "supports_nvfp4_compute", "mxfp8": "supports_mxfp8_compute",
                 "int8_compute": "supports_int8_compute"}
    found = {feature for feature, name in functions.items() if _function_body(mm, name)}
    if "is_ascend_npu()" in _function_body(mm, "should_use_bf16"):
        found.add("bf16_npu")
    if re.search(r"^DISABLE_MMAP\b", utils, re.M):
        found.add("disable_mmap")
    if quant_text:
        found.add("quant_ops")
    if re.search(r"QUANT_ALGOS\[\"int8_tensorwise\"\]", quant_text):
        found.add("int8")
    if "asym_w4a8_int8" in quant_text:
        found.add("w4a8")
    return frozenset(found)


def comfyui_versions_with(*features, without=()):
    """The suite's ComfyUI releases that have every feature in ``features`` and none in ``without``."""
    return tuple(v for v in COMFYUI_VERSIONS
                 if set(features) <= comfyui_features(v) and not set(without) & comfyui_features(v))


def comfyui_representatives(versions=None):
    """The newest release of each distinct feature set: one run per state the shim can meet."""
    newest = {}
    for version in versions or COMFYUI_VERSIONS:  # oldest first
        newest[comfyui_features(version)] = version
    return tuple(v for v in (versions or COMFYUI_VERSIONS) if v in newest.values())


def comfyui_kitchen(version):
    """The comfy-kitchen release a ComfyUI tree pins in requirements.txt (None: it uses none).

    ``==X`` is X; ``>=X`` is the newest of KITCHEN_VERSIONS."""
    requirements = (comfyui_dir(version) / "requirements.txt").read_text()
    match = re.search(r"^comfy-kitchen\s*(==|>=)\s*([\w.]+)", requirements, re.M)
    if not match:
        return None
    return match.group(2) if match.group(1) == "==" else KITCHEN_VERSIONS[-1]


def comfyui_variant(version, folder, text, keep=""):
    """A real release with ``text`` cut out of comfy/model_management.py (``keep`` left).

    Models a ComfyUI state beside the releases. The variant, made in
    ``folder``, is links to the release's files except the one edited copy,
    and is named ``ComfyUI-<version>`` like the release.
    """
    tree = comfyui_dir(version)
    variant = Path(folder) / tree.name
    (variant / "comfy").mkdir(parents=True)
    for entry in tree.iterdir():
        if entry.name != "comfy":
            (variant / entry.name).symlink_to(entry)
    for entry in (tree / "comfy").iterdir():
        if entry.name != "model_management.py":
            (variant / "comfy" / entry.name).symlink_to(entry)
    source = (tree / "comfy" / "model_management.py").read_text()
    if text not in source:
        raise AssertionError("ComfyUI %s no longer holds the text this variant cuts" % version)
    (variant / "comfy" / "model_management.py").write_text(source.replace(text, keep))
    return variant


def bed_env(machine="ascend-cu130", comfy=None, kitchen=None, extra_path=(), **extra):
    """Environment of a subprocess on the simulated machine ``machine``.

    comfy    a ComfyUI tree's path (harness.comfyui_dir), or the name of the
             fake under tests/testbed/comfy_fakes; kitchen  a comfy-kitchen version
    An ascend machine judges ops by torch_npu 2.12.0's registry unless ``extra`` names
    another ``TESTBED_TORCH_NPU_REGISTRY`` (``str(torch_npu_registry("2.14.0"))``).
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
    if machine and machine.startswith("ascend") and "TESTBED_TORCH_NPU_REGISTRY" not in env:
        # the real wheel's kernel registry the simulated NPU judges every op by (the users' 2.12.0)
        env["TESTBED_TORCH_NPU_REGISTRY"] = str(torch_npu_registry(TORCH_NPU_VERSIONS[0]))
    return env


def torch_cuda_build():
    """True when this interpreter's torch is a CUDA build (what the bed's nvidia machine needs)."""
    try:
        import torch
    except Exception:
        return False
    return bool(torch.version.cuda)


def torch_available():
    try:
        import torch  # noqa: F401
    except Exception:
        return False
    return True


STAND_IN = '''"""Stand-in for %(name)s, which has no build for the torch under test here
(tests/testbed/absent_packages.py): importable, failing on use."""
import sys

from testbed.absent_packages import _Absent, _AbsentFinder

sys.meta_path.insert(0, _AbsentFinder(frozenset([__name__])))
_module = _Absent(__name__)
_module.__path__ = []
_module.__spec__ = __spec__
sys.modules[__name__] = _module
'''


def stand_ins(folder, python=sys.executable, packages=("torchvision", "torchaudio")):
    """A folder to put on PYTHONPATH (bed_env's extra_path) in which each of ``packages`` that
    ``python`` cannot import for real is a stand-in: so a child interpreter ComfyUI-style
    (doctor's start check) gets through ComfyUI's imports as the in-process stand-ins do."""
    folder = Path(folder)
    for name in packages:
        if subprocess.run([str(python), "-c", "import " + name], capture_output=True).returncode:
            (folder / name).mkdir(parents=True, exist_ok=True)
            (folder / name / "__init__.py").write_text(STAND_IN % {"name": name})
    return folder
