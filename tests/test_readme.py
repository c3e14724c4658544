"""Every command block of README.md and docs/, run exactly as printed, in a fresh venv.

The first block (install + tests/run.sh) is run by ``.ci/run``; the block of
checks (status, doctor, selftest, bench) is meant for a real NPU, and its
status and doctor lines are run on the simulated machines by
tests/test_newcomer.py. Every other block runs here with ``bash -e -o
pipefail``, its text unchanged. The Chinese part of each page must hold the
same commands, and every link of every page must lead somewhere.
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
    "bench --real-size": "the calibration block needs a real NPU (tests/test_calibration.py runs the kit on the bed)",
    "komikndr/raylight": "the raylight block clones from GitHub into a ComfyUI on an NPU box (tests/e2e/"
                         "test_raylight.py runs raylight's nodes on the bed with the same packages)",
}


# the README, then one page per topic (docs/README.md lists them); each holds English, then 中文
PAGES = ("README.md", "docs/install.md", "docs/commands.md", "docs/how-it-works.md", "docs/fp8.md",
         "docs/compatibility.md", "docs/testbed.md", "docs/workflow.md", "docs/many-npus.md", "docs/raylight.md",
         "docs/README.md")
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def blocks():
    english, chinese = [], []
    for page in PAGES:
        text = (harness.REPO / page).read_text(encoding="utf-8")
        en, _, zh = text.partition("## 中文说明")
        english += FENCE.findall(en)
        chinese += FENCE.findall(zh)
    return english, chinese


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
    assert [kind(b) for b in english] == ["tests/run.sh", "selftest", "pip wheel", "bench --real-size",
                                          "tests/testbed env", "komikndr/raylight"]


def anchors(path):
    """The anchors GitHub makes for a page's headings (lower case, spaces to '-', punctuation out)."""
    made = set()
    for heading in re.findall(r"^#+ (.+)$", path.read_text(encoding="utf-8"), re.MULTILINE):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        made.add(slug)
    return made


def test_every_link_leads_somewhere_and_every_page_has_both_languages():
    listed = set(LINK.findall((harness.REPO / "docs" / "README.md").read_text(encoding="utf-8")))
    for page in harness.REPO.joinpath("docs").glob("*.md"):  # a new topic page must be listed and run
        assert page.name in listed or page.name == "README.md", page
        assert "docs/%s" % page.name in PAGES, page
    broken = []
    for page in PAGES:
        path = harness.REPO / page
        text = path.read_text(encoding="utf-8")
        assert "\n## 中文说明\n" in text, "%s has no 中文 part" % page
        for target in LINK.findall(text):
            if target.startswith(("http://", "https://")):
                continue
            name, _, anchor = target.partition("#")
            linked = (path.parent / name).resolve() if name else path
            if not linked.exists():
                broken.append("%s: %s (no such file)" % (page, target))
            elif anchor and anchor not in anchors(linked):
                broken.append("%s: %s (no such heading)" % (page, target))
    assert broken == []


def test_the_readme_fits_one_screen_and_says_what_the_test_command_is():
    text = (harness.REPO / "README.md").read_text(encoding="utf-8")
    english, _, chinese = text.partition("## 中文说明")
    assert len(english.splitlines()) <= 70, len(english.splitlines())
    first = FENCE.findall(english)[0]
    assert "the project's own test suite" in first and "not needed to use the shim" in first
    assert "本项目自己的测试套件" in FENCE.findall(chinese)[0]
    for section in ("## What it fixes", "## Install", "## Verify", "## Turn off", "## Uninstall", "## Read on"):
        assert section in english, section
    for section in ("### 解决的问题", "### 安装", "### 验证", "### 关闭", "### 卸载", "### 延伸阅读"):
        assert section in chinese, section


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
    # torch and ComfyUI's requirements from the test interpreter, the kitchen the users' v0.30.0 pins
    # and stand-ins for torchvision/torchaudio where this torch has no build of them: doctor imports what
    # ComfyUI's main.py imports before it serves
    outer = sorted({sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"],
                    str(harness.kitchen_dir(harness.COMFYUI_USER_KITCHEN))}) + [str(harness.stand_ins(tmp_path / "stand-ins"))]
    (Path(site) / "zz_comfyui_requirements.pth").write_text("\n".join(outer) + "\n")
    proc, seconds = run_block(block_of("tests/testbed env"), venv, harness.REPO)
    assert "ComfyUI 0.30.0 at" in " ".join(proc.stdout.split()) 
    assert "starts      yes: what ComfyUI's main.py imports before it serves imports here" in proc.stdout
    print("README test-bed block: %.1f s" % seconds)
    out = " ".join(proc.stdout.split())
    assert "1 x Ascend910B3" in out and "ComfyUI 0.30.0 at" in out
    assert "OK: nothing stops ComfyUI from running on the NPU" in out
    assert "import hook installed at startup (no-install mode: PYTHONPATH=%s)" % harness.REPO in out
    assert "patched: ComfyUI 0.30.0, comfy-kitchen 0.2.26, torch_npu 2.12.0" in out
    # ComfyUI's comfy.sd needs torchvision and torchaudio; some test venvs cannot hold a
    # build of them that matches their torch
    missing = set(re.findall(r"No module named '(\w+)'", out))
    assert missing <= {"torchvision", "torchaudio"}
    assert proc.returncode == (1 if missing else 0), proc.stdout + proc.stderr
