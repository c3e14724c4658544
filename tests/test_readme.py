"""Every command block of README.md, run exactly as printed, in a fresh venv.

The first block (install + tests/run.sh) is run by ``.ci/run``; the block of
checks (status, doctor, selftest, bench) is meant for a real NPU, and its
status and doctor lines are run on the simulated machines by
tests/test_newcomer.py. Every other block runs here with ``bash -e -o
pipefail``, its text unchanged. The Chinese part must hold the same commands.
"""

import re
import shutil
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

import pytest

import harness

FENCE = re.compile(r"^```bash\n(.*?)^```", re.MULTILINE | re.DOTALL)
SKIPPED = {
    "tests/run.sh": "the install-and-test block is run by .ci/run",
    "selftest": "the checks block needs a real NPU (tests/test_newcomer.py runs its status and doctor on the bed)",
}


def blocks():
    text = (harness.REPO / "README.md").read_text(encoding="utf-8")
    english, _, chinese = text.partition("## 中文说明")
    return FENCE.findall(english), FENCE.findall(chinese)


def commands(block):
    """The block's commands without comments: what the two languages must share."""
    return [re.sub(r"\s+#.*$", "", line).strip() for line in block.splitlines() if line.strip()]


def kind(block):
    for marker in (*SKIPPED, "pip wheel", "tests/testbed env"):
        if marker in block:
            return marker
    return None


def run_block(block, venv, cwd, timeout=900):
    env = harness.scrubbed_env(VIRTUAL_ENV=venv)
    env["PATH"] = "%s/bin:%s" % (venv, env["PATH"])
    start = time.monotonic()
    proc = subprocess.run(["bash", "-e", "-o", "pipefail", "-c", block], env=env, cwd=str(cwd),
                          capture_output=True, text=True, timeout=timeout)
    return proc, time.monotonic() - start


def test_every_block_is_run_and_both_languages_agree():
    english, chinese = blocks()
    assert [commands(b) for b in english] == [commands(b) for b in chinese]
    assert [kind(b) for b in english] == ["tests/run.sh", "pip wheel", "selftest", "tests/testbed env"]


def block_of(marker):
    (block,) = [b for b in blocks()[0] if kind(b) == marker]
    return block


def fresh_venv(dest):
    pythons = harness.pyenv_pythons()
    python = pythons.get("%d.%d" % sys.version_info[:2]) or sys.executable
    harness.run([python, "-m", "venv", str(dest)], harness.scrubbed_env(), dest.parent, check=True)
    return dest


def test_offline_install_block(tmp_path):
    """Built on a connected machine, installed with --no-index into another venv."""
    checkout = tmp_path / "ascend_shim"
    listed = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=str(harness.REPO),
                            capture_output=True, text=True, check=True).stdout.splitlines()
    for name in listed:
        source = harness.REPO / name
        if source.is_file() and not source.is_symlink():
            (checkout / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, checkout / name)
    block = block_of("pip wheel")
    connected = fresh_venv(tmp_path / "connected")
    proc, _ = run_block(block, connected, checkout)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert sorted(p.name.split("-")[0] for p in (checkout / "dist").iterdir()) == ["ascend_shim", "wrapt"]
    # the offline machine: a second venv, the second line alone, no index
    offline = fresh_venv(tmp_path / "offline")
    proc, _ = run_block(block.splitlines()[1], offline, checkout)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    status = harness.run([str(offline / "bin" / "python"), "-m", "ascend_shim", "status"],
                         harness.scrubbed_env(), tmp_path)
    assert "  import hook  installed at startup (ascend_shim.pth)" in status.stdout.splitlines()


def test_test_bed_block_in_a_fresh_venv_with_torch(tmp_path):
    """The user's own venv with torch and ComfyUI's requirements, no shim installed."""
    if not harness.torch_available():
        pytest.skip("torch is not installed in the test interpreter")
    venv = fresh_venv(tmp_path / "comfyui-venv")
    python = venv / "bin" / "python"
    site = harness.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                       harness.scrubbed_env(), tmp_path, check=True).stdout.strip()
    # torch and ComfyUI's requirements from the test interpreter, the kitchen ComfyUI 0.30.0 pins
    outer = sorted({sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"],
                    str(harness.kitchen_dir("0.2.27"))})
    (Path(site) / "zz_comfyui_requirements.pth").write_text("\n".join(outer) + "\n")
    proc, seconds = run_block(block_of("tests/testbed env"), venv, harness.REPO)
    print("README test-bed block: %.1f s" % seconds)
    out = " ".join(proc.stdout.split())
    assert "1 x Ascend910B3" in out and "ComfyUI 0.30.0 at" in out
    assert "OK: nothing stops ComfyUI from running on the NPU" in out
    assert "import hook installed at startup (no-install mode: PYTHONPATH=%s)" % harness.REPO in out
    assert "patched: ComfyUI 0.30.0, comfy-kitchen 0.2.27, torch_npu 2.12.0" in out
    # ComfyUI's comfy.sd needs torchvision and torchaudio; some test venvs cannot hold a
    # build of them that matches their torch
    missing = set(re.findall(r"No module named '(\w+)'", out))
    assert missing <= {"torchvision", "torchaudio"}
    assert proc.returncode == (1 if missing else 0), proc.stdout + proc.stderr
