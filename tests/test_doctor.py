"""``doctor`` at the process boundary: it says OK only where ComfyUI will run.

Each case is a machine of the simulated test bed (or a venv without torch)
and a ComfyUI shape; doctor's verdict is checked against what really
happens when that ComfyUI is imported there.
"""

import json
import os

import pytest

import harness

DOCTOR_KEYS = {"python", "torch", "torch_npu", "cann", "npu", "npu_cards", "comfy_kitchen", "comfyui", "shim",
               "alloc_conf", "host_dispatch", "environment", "findings", "ok", "vae_dtype", "raylight", "smart_memory"}


def doctor(python, cwd, env, *args):
    return harness.run([str(python), "-m", "ascend_shim", "doctor", *args], env, cwd, timeout=300)


def problems(report):
    return [f for f in report["findings"] if f["severity"] == "problem"]


@pytest.fixture
def plain_venv(tmp_path):
    """A venv with wrapt and no shim installed (for the no-install mode)."""
    pythons = harness.pyenv_pythons()
    if "3.11" not in pythons:
        pytest.skip("needs Python 3.11")
    harness.run([pythons["3.11"], "-m", "venv", str(tmp_path / "plain")], harness.scrubbed_env(),
                tmp_path, check=True)
    python = tmp_path / "plain" / "bin" / "python"
    harness.run([str(python), "-m", "pip", "install", "-q", "--no-index", "--find-links",
                 str(harness.wheelhouse_for(pythons["3.11"])), "wrapt"],
                harness.scrubbed_env(), tmp_path, check=True)
    return python


def not_checked(folder):
    return ("ComfyUI not checked: %s is not a ComfyUI folder (it has no comfy/model_management.py)"
            % folder)


def flat(proc):
    """doctor's text with its line wrapping undone."""
    return " ".join(proc.stdout.split())


def test_comfyui_before_ascend_support_is_a_problem(bed_python, tmp_path):
    """A ComfyUI before its NPU code on the users' box (no release the suite runs is one: the bed's
    small fake models it): its import dies, so doctor must not say OK."""
    comfy = harness.COMFY_FAKES / "before_ascend_support"
    env = harness.bed_env("ascend-cu130", comfy=str(comfy))
    crash = harness.run([str(bed_python), "-c", "import comfy.model_management"], env, tmp_path)
    assert "Found no NVIDIA driver" in crash.stderr

    proc = doctor(bed_python, tmp_path, env, "--comfyui", str(comfy))
    assert proc.returncode == 1
    assert ("[problem] ComfyUI 0.3.9 in %s predates Ascend support (no is_ascend_npu): it cannot run "
            "on this NPU, and the shim leaves it alone" % comfy) in flat(proc)
    assert "fix: upgrade ComfyUI (e.g. git pull in %s)" % comfy in flat(proc)
    assert proc.stdout.rstrip().endswith("PROBLEMS found: ComfyUI will not run properly on the NPU")
    report = json.loads(doctor(bed_python, tmp_path, env, "--json", "--comfyui", str(comfy)).stdout)
    assert set(report) == DOCTOR_KEYS and report["comfyui"]["supports_ascend"] is False


@pytest.mark.parametrize("version, kitchen", [(harness.COMFYUI_USER, harness.COMFYUI_USER_KITCHEN),
                                              (harness.COMFYUI_NEWEST, harness.COMFYUI_NEWEST_KITCHEN)])
def test_supported_comfyui_on_the_npu_is_ok(bed_python, tmp_path, version, kitchen):
    """The users' release and the newest, each with the comfy-kitchen it pins."""
    comfy = harness.comfyui_dir(version)
    # torchvision/torchaudio that import (stand-ins where this venv has none)
    env = harness.bed_env("ascend-cu130", kitchen=kitchen,
                          extra_path=[harness.stand_ins(tmp_path / "stand-ins", bed_python)])
    proc = doctor(bed_python, tmp_path, env, "--json", "--comfyui", str(comfy))
    report = json.loads(proc.stdout)
    assert proc.returncode == 0 and problems(report) == []
    assert report["comfyui"]["starts"] is True  # what main.py imports before it serves imports
    assert report["npu"] == {"available": True, "count": 1, "name": "Ascend910B3"}
    assert report["torch"]["cuda_build"] is True
    assert report["torch_npu"]["quant_ops"] == {"npu_dynamic_quant": True, "npu_quant_matmul": True}
    assert report["cann"] == "9.1.0-beta.1"
    assert report["comfy_kitchen"]["version"] == kitchen
    assert report["comfy_kitchen"]["upstream_ascend_backend"] is False
    assert report["comfyui"]["version"] == version.lstrip("v") and report["comfyui"]["supports_ascend"] is True
    assert report["comfyui"]["kitchen_pin"] == "==" + kitchen and report["comfyui"]["kitchen_in_use"] is True
    assert report["alloc_conf"] == "expandable_segments:True, set by the shim when ComfyUI starts"
    # ComfyUI's cuda_malloc.py sets cudaMallocAsync in its own process: foreseen, not seen in the shell
    assert any("cuda_malloc.py will set PYTORCH_CUDA_ALLOC_CONF" in f["what"] for f in report["findings"])
    text = doctor(bed_python, tmp_path, env, "--comfyui", str(comfy)).stdout
    assert max(len(line) for line in text.splitlines()) <= 100


@pytest.mark.parametrize("machine", ["cpu", "nvidia"])
def test_no_claims_about_an_npu_on_other_machines(bed_python, tmp_path, machine):
    proc = doctor(bed_python, tmp_path, harness.bed_env(machine), "--comfyui",
                  str(harness.comfyui_dir(harness.COMFYUI_USER)))
    assert proc.returncode == 0
    assert "the NPU" not in proc.stdout
    assert proc.stdout.rstrip().endswith("OK: no Ascend NPU here, so the shim stays inert; nothing to fix")


def test_missing_comfyui_folder_is_named_not_asked_for(bed_python, tmp_path):
    missing = tmp_path / "nonexistent"
    proc = doctor(bed_python, tmp_path, harness.bed_env("ascend-cu130"), "--comfyui", str(missing))
    assert "pass --comfyui" not in proc.stdout
    assert "[problem] no ComfyUI in %s (it has no comfy/model_management.py)" % missing in flat(proc)
    assert proc.returncode == 1 and "OK:" not in proc.stdout  # a folder given and missing is not OK


def test_switched_off_says_unset_not_install(bed_python, tmp_path):
    proc = doctor(bed_python, tmp_path, harness.bed_env("ascend-cu130", ASCEND_SHIM="0"))
    assert proc.returncode == 1
    assert "pip install" not in proc.stdout
    assert "[problem] the shim is not active: switched off by ASCEND_SHIM=0" in flat(proc)
    assert "fix: unset ASCEND_SHIM (it is '0')" in flat(proc)
    assert "is a CUDA build on an NPU machine" in proc.stdout


def test_alloc_conf_when_torch_npu_does_not_import(bed_python, tmp_path):
    env = harness.bed_env("ascend-cpu",
                          TESTBED_TORCH_NPU_IMPORT_ERROR="libhccl.so: cannot open shared object file")
    report = json.loads(doctor(bed_python, tmp_path, env, "--json").stdout)
    assert report["alloc_conf"] == "no effect: torch_npu does not import, nothing reads it"
    assert [f["what"] for f in problems(report)] == [
        "torch_npu does not import: libhccl.so: cannot open shared object file", not_checked(tmp_path)]


def test_without_torch(venv_for, tmp_path):
    python = venv_for("3.12")
    proc = doctor(python, tmp_path, harness.scrubbed_env(), "--json")
    report = json.loads(proc.stdout)
    assert set(report) == DOCTOR_KEYS
    assert proc.returncode == 1 and report["ok"] is False
    assert [f["what"] for f in problems(report)] == ["torch is not installed in this interpreter",
                                                     not_checked(tmp_path)]
    assert report["shim"]["active"] is True and report["shim"]["how"] == "ascend_shim.pth"


def test_no_install_mode_status_and_doctor_agree(plain_venv, tmp_path):
    env = harness.scrubbed_env(PYTHONPATH=harness.REPO)
    how = "no-install mode: PYTHONPATH=%s" % harness.REPO
    status = harness.run([str(plain_venv), "-m", "ascend_shim", "status"], env, tmp_path)
    assert "  import hook  installed at startup (%s)" % how in status.stdout.splitlines()
    report = json.loads(doctor(plain_venv, tmp_path, env, "--json").stdout)
    assert report["shim"]["active"] is True and report["shim"]["how"] == how
    text = doctor(plain_venv, tmp_path, env).stdout
    assert "shim        %s, installed (%s), inert here: no NPU" % (report["shim"]["version"], how) in text


def test_pythonpath_at_the_package_folder_is_reported(plain_venv, tmp_path):
    other = tmp_path / "other"
    other.mkdir()
    (other / "sitecustomize.py").write_text("import os\nos.environ['OTHER_SITECUSTOMIZE'] = 'ran'\n")
    package = harness.REPO / "ascend_shim"
    env = harness.scrubbed_env(PYTHONPATH=os.pathsep.join([str(package), str(other)]))
    code = "import os, sys; print(os.environ.get('OTHER_SITECUSTOMIZE'), 'ascend_shim' in sys.modules)"
    proc = harness.run([str(plain_venv), "-c", code], env, tmp_path)
    assert proc.returncode == 0 and proc.stdout.split() == ["ran", "False"]
    assert proc.stderr == ("ascend_shim: NOT active: PYTHONPATH points at the package folder %s; "
                           "point it at the checkout root instead: PYTHONPATH=%s\n"
                           % (package, harness.REPO))
    closed = harness.run([str(plain_venv), "-c", "import sys; sys.stderr = None; print('alive')"],
                         env, tmp_path)
    assert closed.returncode == 0 and closed.stdout.strip() == "alive"


def test_package_folder_on_pythonpath_is_not_reported_where_the_installed_shim_is_active(
        bed_python, tmp_path):
    env = harness.scrubbed_env(PYTHONPATH=str(harness.REPO / "ascend_shim"))
    code = "import ascend_shim, sys; print(ascend_shim.finder_installed())"
    proc = harness.run([str(bed_python), "-c", code], env, tmp_path)
    assert proc.returncode == 0 and proc.stdout.split() == ["True"]
    assert "NOT active" not in proc.stderr


def test_package_folder_detector_stays_out_of_the_wheel(shim_wheel):
    import zipfile

    names = zipfile.ZipFile(shim_wheel).namelist()
    assert "ascend_shim/sitecustomize.py" not in names
    assert "ascend_shim/_sitecustomize_chain.py" not in names  # no-install mode only
    assert not [name for name in names if "sitecustomize" in name], names
    assert "ascend_shim/commands/main.py" in names


def test_editable_install_is_harmless_and_reported(tmp_path):
    """``pip install -e .`` puts the checkout root on sys.path: its sitecustomize
    may run besides the .pth; one hook, no output, and one story from both commands."""
    pythons = harness.pyenv_pythons()
    if "3.11" not in pythons:
        pytest.skip("needs Python 3.11")
    python = harness.make_venv_editable(pythons["3.11"], tmp_path / "venv")
    code = "import sys; print(sum('ascend_shim' in repr(f) for f in sys.meta_path))"
    idle = harness.run([str(python), "-c", code], harness.scrubbed_env(), tmp_path)
    assert idle.returncode == 0 and idle.stdout.strip() == "1" and idle.stderr == ""
    status = harness.run([str(python), "-m", "ascend_shim", "status", "--json"], harness.scrubbed_env(),
                         tmp_path)
    report = json.loads(doctor(python, tmp_path, harness.scrubbed_env(), "--json").stdout)
    assert json.loads(status.stdout)["startup"]["how"] == report["shim"]["how"]
    assert report["shim"]["active"] is True


def _comfyui_with_raylight(tmp_path):
    """The users' ComfyUI v0.30.0, linked, with raylight 1.7.2 in its custom_nodes."""
    comfy = tmp_path / "ComfyUI"
    comfy.mkdir()
    for entry in harness.comfyui_dir(harness.COMFYUI_USER).iterdir():
        if entry.name != "custom_nodes":
            (comfy / entry.name).symlink_to(entry)
    (comfy / "custom_nodes").mkdir()
    (comfy / "custom_nodes" / "raylight").symlink_to(harness.raylight_dir("1.7.2"))
    return comfy


@pytest.mark.skipif(not harness.raylight_available(), reason="ray/xfuser/yunchang are not installed")
def test_raylight_in_custom_nodes_is_named_with_what_it_needs_and_what_the_shim_does(bed_python, tmp_path):
    comfy = _comfyui_with_raylight(tmp_path)
    env = harness.bed_env("ascend-cu130", kitchen=harness.COMFYUI_USER_KITCHEN, TESTBED_NPU_COUNT="8",
                          extra_path=[harness.stand_ins(tmp_path / "stand-ins", bed_python)])
    report = json.loads(doctor(bed_python, tmp_path, env, "--json", "--comfyui", str(comfy)).stdout)
    assert report["raylight"]["version"] == "1.7.2"
    assert report["raylight"]["needs"]["ray"] == "2.60.0" and report["raylight"]["needs"]["xfuser"] == "0.7.0"
    (line,) = [f["what"] for f in report["findings"] if "raylight" in f["what"]]
    assert line.startswith("raylight 1.7.2 in %s runs its workers on the NPUs: 8 card(s) for its GPU count, "
                           "one Ray NPU each, HCCL; ulysses_degree must divide" % (comfy / "custom_nodes" / "raylight"))
    off = json.loads(doctor(bed_python, tmp_path, dict(env, ASCEND_SHIM_DISABLE="raylight_workers"), "--json",
                            "--comfyui", str(comfy)).stdout)
    (warning,) = [f for f in off["findings"] if "raylight" in f["what"]]
    assert warning["severity"] == "warning" and "the shim's raylight patches are off (raylight_workers)" in \
        warning["what"]
