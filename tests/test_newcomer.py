"""A newcomer's first run, on the real ComfyUI 0.30.0 tree and the simulated machines.

Every output a newcomer reads must be true when printed: status and doctor
on machines where the shim does nothing, outside the ComfyUI folder, with a
comfy-kitchen ComfyUI cannot import; and where the shim does nothing, none
of its frames may appear in a traceback (issue 19 items 2, 3, 6; issue 18
items 9-13).
"""

import json
import re
import shutil
import sys

import pytest

import harness

COMFYUI = "0.30.0"
NOT_ACTIVE_MACHINES = ("cpu", "nvidia")
FINDER = "import sys; print('finder', any('ascend_shim' in repr(f) for f in sys.meta_path))"


@pytest.fixture(scope="module")
def comfyui():
    return harness.comfyui_dir(COMFYUI)


def shim(python, args, cwd, env):
    return harness.run([str(python), "-m", "ascend_shim", *args], env, cwd, timeout=300)


def problems(report, severity="problem"):
    return [f["what"] for f in report["findings"] if f["severity"] == severity]


def flat(text):
    return " ".join(text.split())


def table_rows(stdout):
    """{patch name: (shown state, detail)} from status's table."""
    lines = stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("name "))
    rows = {}
    for line in lines[start + 1:]:
        if not line.strip():
            break
        parts = line.split(None, 3)
        rows[parts[0]] = (parts[2], parts[3] if len(parts) > 3 else "")
    return rows


@pytest.mark.parametrize("machine", NOT_ACTIVE_MACHINES)
def test_no_shim_frame_in_a_traceback_where_it_does_nothing(bed_python, comfyui, tmp_path, machine):
    # ComfyUI without --cpu: on the CPU (and on the bed's NVIDIA box with a CPU torch)
    # its own import error; wherever it fails, no shim frame
    crash = harness.run([str(bed_python), "-c", "import comfy.model_management"],
                        harness.bed_env(machine, kitchen="0.2.27"), comfyui)
    assert crash.returncode == 0 or "Traceback" in crash.stderr
    assert crash.returncode != 0 or machine == "nvidia"
    assert "ascend_shim" not in crash.stderr, crash.stderr
    # a watched module that raises, imported after the shim decided: no frame, finder gone
    broken = tmp_path / "broken"
    (broken / "comfy_kitchen").mkdir(parents=True)
    (broken / "comfy_kitchen" / "__init__.py").write_text("raise RuntimeError('a bug of its own')\n")
    code = "import traceback\ntry:\n    import comfy_kitchen\nexcept RuntimeError:\n" \
           "    traceback.print_exc()\n" + FINDER
    proc = harness.run([str(bed_python), "-c", code], harness.bed_env(machine, extra_path=[broken]),
                       tmp_path)
    assert "RuntimeError: a bug of its own" in proc.stderr
    assert "ascend_shim" not in proc.stderr, proc.stderr
    assert proc.stdout.split() == ["finder", "False"]


def test_the_shim_stays_on_the_import_path_where_it_acts(bed_python, tmp_path):
    """The counterpart: on the users' box the finder stays; with torch_npu but
    no NPU it leaves once torch_npu has executed."""
    code = "import torch_npu\n" + FINDER
    on_npu = harness.run([str(bed_python), "-c", code], harness.bed_env("ascend-cu130"), tmp_path)
    assert on_npu.stdout.split() == ["finder", "True"], on_npu.stderr
    no_card = harness.run([str(bed_python), "-c", code],
                          harness.bed_env("ascend-cu130", TESTBED_NPU_COUNT="0"), tmp_path)
    assert no_card.stdout.split() == ["finder", "False"], no_card.stderr


def cuda_imports(python, machine):
    """Whether the bed's NVIDIA box runs ComfyUI here: only with a CUDA-build torch."""
    probe = harness.run([str(python), "-c", "import torch; print(torch.version.cuda)"],
                        harness.scrubbed_env(), harness.REPO)
    return machine == "nvidia" and probe.stdout.strip() not in ("", "None")


def missing_requirements(stdout):
    """ComfyUI requirements a follow-up import lacked (torchvision, torchaudio: some
    test venvs cannot hold a build matching their torch)."""
    return set(re.findall(r"No module named '(\w+)'", stdout))


@pytest.mark.parametrize("machine", NOT_ACTIVE_MACHINES)
def test_status_import_without_an_npu_says_what_happened(bed_python, comfyui, tmp_path, machine):
    env = harness.bed_env(machine, kitchen="0.2.27")
    proc = shim(bed_python, ["status", "--import", "comfy.model_management"], comfyui, env)
    out = flat(proc.stdout)
    assert "patched:" not in proc.stdout  # nothing was patched (issue 18 item 11)
    assert " also " not in out  # the shim left: no follow-up import is needed here
    if cuda_imports(bed_python, machine):  # a CUDA-build torch on the NVIDIA box: ComfyUI starts
        assert proc.returncode == 0 and "next: nothing to do on this machine" in out
    else:
        assert proc.returncode == 1
        assert "imported comfy.model_management FAILED:" in out
        assert ("next: no NPU here, so the shim did nothing: this is ComfyUI's own error on this "
                "machine (ComfyUI took its CUDA path); on a machine without a working NVIDIA GPU "
                "start ComfyUI with --cpu") in out
        assert "nothing to do on this machine" not in out
    rows = table_rows(proc.stdout)
    assert len(rows) > 15 and {state for state, _ in rows.values()} == {"inert"}
    assert all(detail.startswith("never decided: the shim left the import path") for _, detail in rows.values())
    # outside the ComfyUI folder: say where to go
    away = shim(bed_python, ["status", "--import", "comfy.model_management"], tmp_path, env)
    assert away.returncode == 1
    assert ("next: `comfy` is ComfyUI's own folder, not an installed package: cd into the ComfyUI "
            "folder (the one holding main.py) and run this again") in flat(away.stdout)


def test_rows_on_the_npu_say_what_they_wait_for(bed_python, tmp_path):
    """Plain status on the users' box imports torch_npu: alloc_conf_withdraw then
    waits for the patch alloc_conf, not for an import that already happened."""
    proc = shim(bed_python, ["status"], tmp_path, harness.bed_env("ascend-cu130"))
    rows = table_rows(proc.stdout)
    assert rows["alloc_conf_withdraw"] == ("pending", "waiting for patch alloc_conf to be decided")
    assert rows["is_nvidia"][1].startswith("waiting for comfy.model_management")


def test_comfyui_without_its_kitchen_is_reported(bed_python, comfyui, tmp_path):
    """ComfyUI 0.30.0 pins comfy-kitchen==0.2.27; 0.2.26 lacks AsymW4A8Int8Layout, so
    ComfyUI runs without kitchen: doctor and status must say so (issue 18 item 9)."""
    env = harness.bed_env("ascend-cu130", kitchen="0.2.26")
    proc = shim(bed_python, ["doctor", "--json"], comfyui, env)
    report = json.loads(proc.stdout)
    assert proc.returncode == 1 and report["ok"] is False
    assert report["comfyui"]["kitchen_pin"] == "==0.2.27" and report["comfyui"]["kitchen_in_use"] is False
    (problem,) = problems(report)
    assert problem.startswith("ComfyUI 0.30.0 runs without comfy-kitchen") and "AsymW4A8Int8Layout" in problem
    assert problems(report, "warning") == [
        "comfy-kitchen 0.2.26 is installed; ComfyUI 0.30.0 asks for comfy-kitchen==0.2.27 (its requirements.txt)"]
    assert "OK" not in shim(bed_python, ["doctor"], comfyui, env).stdout
    status = shim(bed_python, ["status", "--import", "comfy.quant_ops"], comfyui, env)
    assert ("INT8 (comfy-kitchen): not in use: this ComfyUI runs without comfy-kitchen" in flat(status.stdout))
    assert "ascend_shim first" not in status.stdout
    assert table_rows(status.stdout)["kitchen_int8"][1].startswith("unused, ComfyUI runs without comfy-kitchen")

    good = json.loads(shim(bed_python, ["doctor", "--json"], comfyui,
                           harness.bed_env("ascend-cu130", kitchen="0.2.27")).stdout)
    assert good["ok"] is True and good["comfyui"]["kitchen_in_use"] is True
    assert not [f for f in good["findings"] if "kitchen" in f["what"]]


def test_doctor_outside_comfyui_gives_no_ok(bed_python, tmp_path):
    for machine in ("ascend-cu130", "cpu"):
        proc = shim(bed_python, ["doctor"], tmp_path, harness.bed_env(machine))
        assert proc.returncode == 1 and "OK" not in proc.stdout, proc.stdout
        assert "ComfyUI was NOT checked" in proc.stdout or "ComfyUI NOT checked" in proc.stdout


def test_doctor_lines_are_true(bed_python, venv_for, tmp_path):
    # a torch that is installed but broken is not "not installed"
    broken = tmp_path / "broken"
    (broken / "torch").mkdir(parents=True)
    (broken / "torch" / "__init__.py").write_text("raise OSError('libtorch_cpu.so: cannot open shared object')\n")
    report = json.loads(shim(venv_for("3.12"), ["doctor", "--json"], tmp_path,
                             harness.scrubbed_env(PYTHONPATH=broken)).stdout)
    assert "torch is not installed in this interpreter" not in problems(report)
    assert "import torch fails: libtorch_cpu.so: cannot open shared object" in problems(report)
    # a torch_npu whose error has no text keeps its prefix
    quiet = tmp_path / "quiet"
    (quiet / "torch_npu").mkdir(parents=True)
    (quiet / "torch_npu" / "__init__.py").write_text("raise ImportError('')\n")
    report = json.loads(shim(bed_python, ["doctor", "--json"], tmp_path,
                             harness.bed_env("cpu", extra_path=[quiet])).stdout)
    assert "torch_npu does not import: ImportError" in problems(report)
    # everything disabled: no promise of the allocator setting, no is_nvidia correction
    report = json.loads(shim(bed_python, ["doctor", "--json"], tmp_path,
                             harness.bed_env("ascend-cu130", ASCEND_SHIM_DISABLE="*")).stdout)
    assert report["alloc_conf"] == "unset (torch_npu's default)"
    assert not [f for f in report["findings"] if "patch corrects it" in f["what"]]
    # no NPU: the shim is installed but not active here
    text = shim(bed_python, ["doctor"], tmp_path, harness.bed_env("nvidia")).stdout
    assert "shim        0.2.0, installed (ascend_shim.pth), inert here: no NPU" in text.splitlines()
    assert ", active" not in text


@pytest.mark.parametrize("machine", ("cpu", "nvidia", "ascend-cu130"))
def test_newcomer_path(shim_wheel, comfyui, tmp_path, machine):
    """install, status, status --import in and out of ComfyUI, doctor, the test bed
    by hand, uninstall: on each machine, with the real ComfyUI 0.30.0."""
    if not harness.torch_available():
        pytest.skip("torch is not installed in the test interpreter")
    python = harness.make_venv(sys.executable, tmp_path / "venv", shim_wheel, with_outer_site=True)
    env = harness.bed_env(machine, kitchen="0.2.27")
    npu = machine.startswith("ascend")

    status = shim(python, ["status"], tmp_path, env)
    assert status.returncode == 0 and "Traceback" not in status.stderr
    assert "  import hook  installed at startup (ascend_shim.pth)" in status.stdout.splitlines()
    assert (" pending " in status.stdout) is npu and ("x Ascend910B3" in status.stdout) is npu

    inside = shim(python, ["status", "--import", "comfy.model_management"], comfyui, env)
    assert "Traceback" not in inside.stdout
    if npu:
        states = {state for state, _ in table_rows(inside.stdout).values()}
        assert "applied" in states and "inert" not in states
        assert "patched: ComfyUI 0.30.0, comfy-kitchen 0.2.27, torch_npu 2.12.0" in inside.stdout
        # comfy.sd (a follow-up import) needs torchvision and torchaudio, which this venv may lack
        missing = missing_requirements(inside.stdout)
        assert inside.returncode == (1 if missing else 0), inside.stdout
        assert missing <= {"torchvision", "torchaudio"}
    elif cuda_imports(python, machine):
        assert inside.returncode == 0 and "patched:" not in inside.stdout
    else:
        assert inside.returncode == 1 and "start ComfyUI with --cpu" in flat(inside.stdout)
        assert "patched:" not in inside.stdout
    outside = shim(python, ["status", "--import", "comfy.model_management"], tmp_path, env)
    assert outside.returncode == 1 and "cd into the ComfyUI folder" in flat(outside.stdout)

    doctor = shim(python, ["doctor"], comfyui, env)
    assert doctor.returncode == 0, doctor.stdout
    assert doctor.stdout.rstrip().endswith(
        "OK: nothing stops ComfyUI from running on the NPU" if npu
        else "OK: no Ascend NPU here, so the shim stays inert; nothing to fix")

    # the test bed by hand, as the README runs it, with this venv's python
    bed = harness.run([str(python), str(harness.TESTBED), "run", machine, "--", "python", "-m",
                       "ascend_shim", "status"], harness.scrubbed_env(), harness.REPO)
    assert bed.returncode == 0, bed.stderr
    assert ("1 x Ascend910B3" in bed.stdout) is npu

    gone = harness.run([str(python), "-m", "pip", "uninstall", "-y", "ascend-shim"], harness.scrubbed_env(),
                       tmp_path)
    assert gone.returncode == 0, gone.stderr
    after = harness.run([str(python), "-c", "import ascend_shim"], harness.scrubbed_env(), tmp_path)
    assert after.returncode == 1 and "No module named 'ascend_shim'" in after.stderr
    quiet = harness.run([str(python), "-c", "pass"], harness.scrubbed_env(), tmp_path)
    assert quiet.returncode == 0 and quiet.stderr == ""
    assert harness.run([str(python), "-c", "import wrapt"], harness.scrubbed_env(), tmp_path).returncode == 0
    shutil.rmtree(tmp_path / "venv")
