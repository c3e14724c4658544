"""A newcomer's first run, on the users' release (ComfyUI v0.30.0) and the simulated machines.

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

COMFYUI = harness.COMFYUI_USER
KITCHEN = harness.COMFYUI_USER_KITCHEN  # the one it pins
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
        if line.startswith(" "):  # the detail goes on under itself
            name = list(rows)[-1]
            rows[name] = (rows[name][0], rows[name][1] + " " + line.strip())
            continue
        parts = line.split(None, 3)
        rows[parts[0]] = (parts[2], parts[3] if len(parts) > 3 else "")
    return rows


@pytest.mark.parametrize("machine", NOT_ACTIVE_MACHINES)
def test_no_shim_frame_in_a_traceback_where_it_does_nothing(bed_python, comfyui, tmp_path, machine):
    # ComfyUI without --cpu: on the CPU (and on the bed's NVIDIA box with a CPU torch)
    # its own import error; wherever it fails, no shim frame
    crash = harness.run([str(bed_python), "-c", "import comfy.model_management"],
                        harness.bed_env(machine, kitchen=KITCHEN), comfyui)
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
    env = harness.bed_env(machine, kitchen=KITCHEN)
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
    # every patch inert for the one reason: said once, not in one identical row per patch
    said = re.search(r"^all (\d+) patches  inert: never decided: the shim left the import path", proc.stdout, re.M)
    assert said and int(said.group(1)) > 15, proc.stdout
    assert not re.search(r"^is_nvidia ", proc.stdout, re.M)
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
    assert rows["is_nvidia"][1] == "comfy is not loaded in this process (waits for comfy.model_management)"


def test_comfyui_without_its_kitchen_is_reported(bed_python, comfyui, tmp_path):
    """ComfyUI v0.30.0 pins comfy-kitchen==0.2.26; 0.2.11 lacks TensorCoreConvRotW4A4Layout, so
    ComfyUI runs without kitchen: doctor and status must say so (issue 18 item 9)."""
    # torchvision/torchaudio that import (stand-ins where this venv has none): doctor's start check passes
    starts = [harness.stand_ins(tmp_path / "stand-ins", bed_python)]
    env = harness.bed_env("ascend-cu130", kitchen="0.2.11", extra_path=starts)
    proc = shim(bed_python, ["doctor", "--json"], comfyui, env)
    report = json.loads(proc.stdout)
    assert proc.returncode == 1 and report["ok"] is False
    assert report["comfyui"]["kitchen_pin"] == "==0.2.26" and report["comfyui"]["kitchen_in_use"] is False
    (problem,) = problems(report)
    assert problem.startswith("ComfyUI 0.30.0 runs without comfy-kitchen") and "TensorCoreConvRotW4A4Layout" in problem
    assert problems(report, "warning") == [
        "comfy-kitchen 0.2.11 is installed; ComfyUI 0.30.0 asks for comfy-kitchen==0.2.26 (its requirements.txt)"]
    assert "OK" not in shim(bed_python, ["doctor"], comfyui, env).stdout
    status = shim(bed_python, ["status", "--import", "comfy.quant_ops"], comfyui, env)
    assert ("INT8 (comfy-kitchen): not in use: this ComfyUI runs without comfy-kitchen" in flat(status.stdout))
    summary = status.stdout.split("\npatched: ", 1)[1]  # below the table: what runs, not the registry's order
    assert "ascend_shim first" not in summary
    # 0.2.11's own __version__ says "0.1.0": status names the release installed
    assert summary.startswith("ComfyUI 0.30.0, comfy-kitchen 0.2.11, "), summary
    assert table_rows(status.stdout)["kitchen_int8"][1].startswith("unused, ComfyUI runs without comfy-kitchen")

    good = json.loads(shim(bed_python, ["doctor", "--json"], comfyui,
                           harness.bed_env("ascend-cu130", kitchen=KITCHEN, extra_path=starts)).stdout)
    assert good["ok"] is True and good["comfyui"]["kitchen_in_use"] is True
    assert not [f for f in good["findings"] if "kitchen" in f["what"]]


def test_doctor_outside_comfyui_gives_no_ok(bed_python, tmp_path):
    for machine in ("ascend-cu130", "cpu"):
        proc = shim(bed_python, ["doctor"], tmp_path, harness.bed_env(machine))
        # a problem on the Ascend box; on a CPU one only the note (issue 28 item 6)
        assert proc.returncode == (1 if machine == "ascend-cu130" else 0) and "OK" not in proc.stdout, proc.stdout
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
    by hand, uninstall: on each machine, with the users' release, ComfyUI v0.30.0."""
    if not harness.torch_available():
        pytest.skip("torch is not installed in the test interpreter")
    python = harness.make_venv(sys.executable, tmp_path / "venv", shim_wheel, with_outer_site=True)
    env = harness.bed_env(machine, kitchen=KITCHEN)
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
        assert "patched: ComfyUI 0.30.0, comfy-kitchen 0.2.26, torch_npu 2.12.0" in inside.stdout
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
    # on the NPU doctor imports what main.py imports: this venv may lack torchvision/torchaudio
    lacking = [name for name in ("torchvision", "torchaudio")
               if harness.run([str(python), "-c", "import " + name], env, tmp_path).returncode]
    if npu and lacking:
        assert doctor.returncode == 1 and "ComfyUI cannot start:" in flat(doctor.stdout), doctor.stdout
        assert "No module named '%s'" % lacking[0] in flat(doctor.stdout)
    else:
        assert doctor.returncode == 0, doctor.stdout
        assert doctor.stdout.rstrip().endswith(
            "OK: nothing stops ComfyUI from running on the NPU" if npu
            else "OK: no Ascend NPU here, so the shim stays inert; nothing to fix")

    # the test bed by hand, as the README runs it, with this venv's python
    bed = harness.run([str(python), str(harness.TESTBED), "run", machine, "--", "python", "-m",
                       "ascend_shim", "status"], harness.scrubbed_env(), harness.REPO)
    assert bed.returncode == 0, bed.stderr
    assert ("1 x Ascend910B3" in bed.stdout) is npu
    # --installed: the shim this venv installed, not the checkout's copy (issue 28 item 8)
    installed = [str(python), str(harness.TESTBED), "run", "--installed", machine, "--", "python", "-m",
                 "ascend_shim", "status"]
    bed = harness.run(installed, harness.scrubbed_env(), harness.REPO)
    assert "  import hook  installed at startup (ascend_shim.pth)" in bed.stdout.splitlines(), bed.stdout

    gone = harness.run([str(python), "-m", "pip", "uninstall", "-y", "ascend-shim"], harness.scrubbed_env(),
                       tmp_path)
    assert gone.returncode == 0, gone.stderr
    after = harness.run([str(python), "-c", "import ascend_shim"], harness.scrubbed_env(), tmp_path)
    assert after.returncode == 1 and "No module named 'ascend_shim'" in after.stderr
    gone_on_bed = harness.run(installed, harness.scrubbed_env(), tmp_path)
    assert gone_on_bed.returncode == 1 and "No module named ascend_shim" in gone_on_bed.stderr
    quiet = harness.run([str(python), "-c", "pass"], harness.scrubbed_env(), tmp_path)
    assert quiet.returncode == 0 and quiet.stderr == ""
    assert harness.run([str(python), "-c", "import wrapt"], harness.scrubbed_env(), tmp_path).returncode == 0
    shutil.rmtree(tmp_path / "venv")


# --------------------------------------------------------------------------- issue 28: first run, round three

NMS = "operator torchvision::nms does not exist"
SHIM_LINE = "# ascend_shim only runs this module's own code here: what raised is in the frames below"


def broken_torchvision(folder):
    """A torchvision built for another torch, as pip pairs it with torch 2.13.0: its import dies
    registering its C++ ops (the venvs here hold no mismatched build, so its error is reproduced)."""
    (folder / "torchvision").mkdir(parents=True)
    (folder / "torchvision" / "__init__.py").write_text("raise RuntimeError(%r)\n" % NMS)
    return folder


def paired_torchvision():
    import torch

    major, minor, patch = (int(x) for x in re.findall(r"\d+", torch.__version__)[:3])
    return "0.%d.%d" % (minor + 15, patch)


def test_doctor_knows_when_comfyui_cannot_start(bed_python, comfyui, tmp_path):
    """Item 1: ComfyUI's main.py dies importing a torchvision built for another torch; doctor
    says so with the matching pair, and status's next step names that fix, not doctor again.
    Item 9: doctor names TorchCompileModel's inductor default on the NPU."""
    env = harness.bed_env("ascend-cu130", kitchen=KITCHEN, extra_path=[broken_torchvision(tmp_path / "tv")])
    proc = shim(bed_python, ["doctor", "--json"], comfyui, env)
    report = json.loads(proc.stdout)
    assert proc.returncode == 1 and report["ok"] is False and report["comfyui"]["starts"] is False
    (problem,) = [f for f in report["findings"] if f["severity"] == "problem"]
    assert problem["what"].startswith("ComfyUI cannot start: `import torchvision` fails: RuntimeError: " + NMS)
    assert "pip install torchvision==%s --no-deps" % paired_torchvision() in problem["fix"]
    (compile_note,) = [f for f in report["findings"] if "TorchCompileModel" in f["what"]]
    assert "'inductor'" in compile_note["what"] and "torchair.get_npu_backend()" in compile_note["what"]
    assert "real 910B" in compile_note["fix"]
    status = shim(bed_python, ["status", "--import", "nodes"], comfyui, env)
    next_line = flat(status.stdout).partition("next: ")[2]
    assert status.returncode == 1 and "torchvision==%s" % paired_torchvision() in next_line
    assert "doctor" not in next_line  # doctor would only say the same: no loop
    # any other failing import: its own traceback, never a command that sends the user back here
    (tmp_path / "tv" / "custom_thing.py").write_text("raise ValueError('its own bug')\n")
    other = shim(bed_python, ["status", "--import", "custom_thing"], comfyui, env)
    next_line = flat(other.stdout).partition("next: ")[2]
    assert other.returncode == 1 and "python -c 'import custom_thing'" in next_line and "doctor" not in next_line
    # with torchvision and torchaudio that import (stand-ins where this venv has no build), it starts
    good = harness.bed_env("ascend-cu130", kitchen=KITCHEN,
                           extra_path=[harness.stand_ins(tmp_path / "ok", bed_python)])
    report = json.loads(shim(bed_python, ["doctor", "--json"], comfyui, good).stdout)
    assert report["ok"] is True and report["comfyui"]["starts"] is True, report["findings"]


def test_offline_recipe_names_the_cpu_architecture():
    """Item 2: many 910B hosts are aarch64; wrapt ships compiled wheels per architecture."""
    text = (harness.REPO / "docs" / "install.md").read_text(encoding="utf-8")
    english, _, chinese = text.partition("## 中文说明")
    assert "same Python version, OS and CPU architecture" in flat(english) and "aarch64" in english
    assert "--platform manylinux2014_aarch64" in english and "--platform manylinux2014_aarch64" in chinese
    assert "CPU 架构" in chinese and "aarch64" in chinese


def test_a_comfyui_traceback_says_whose_error_it_is(bed_python, comfyui, tmp_path):
    """Item 3: each shim frame in a ComfyUI traceback says it only runs the module's own code;
    no frame of the hook's internals (startup/hook.py) remains."""
    env = harness.bed_env("ascend-cu130", kitchen=KITCHEN, extra_path=[broken_torchvision(tmp_path / "tv")])
    proc = harness.run([str(bed_python), "-c", "import nodes"], env, comfyui)
    lines = proc.stderr.splitlines()
    assert lines[-1] == "RuntimeError: " + NMS, proc.stderr
    frames = [i for i, line in enumerate(lines) if line.startswith('  File "')]
    shim_frames = [i for i in frames if "ascend_shim" in lines[i]]
    assert len(shim_frames) >= 3  # nodes -> comfy.diffusers_load -> comfy.sd -> ...: one per watched import
    for i in shim_frames:
        assert lines[i].endswith(", in _exec_module") and lines[i + 1].strip().endswith(SHIM_LINE), lines[i:i + 2]
    assert len(shim_frames) == len([i for i in frames if "/comfy/" in lines[i]])
    assert "startup/hook.py" not in proc.stderr


CONSOLE = """
import logging, sys
logging.basicConfig(level=logging.INFO, stream=sys.stdout, format="%(message)s")
from testbed.absent_packages import stand_in_for
stand_in_for(("torchvision", "torchaudio"))
import comfy.model_management, comfy.utils, nodes, execution


class Server:  # what PromptExecutor reads of ComfyUI's server
    client_id = last_node_id = last_prompt_id = None

    def send_sync(self, *args, **kwargs):
        pass


executor = execution.PromptExecutor(Server(), cache_args={"lru": 0, "ram": 0, "ram_inactive": 0})
for prompt_id in ("first", "second"):
    executor.execute({}, prompt_id, {}, [])
    print("executed", prompt_id, executor.success)
"""


def test_the_console_says_what_the_shim_turned_off_and_names_every_patch(bed_python, comfyui, tmp_path):
    """Item 4: after ComfyUI's "Using async weight offloading" / "Enabled pinned memory", one line
    says the shim turned them off and why; the patches applied after the startup line are named
    once, after the first prompt."""
    script = tmp_path / "console.py"
    script.write_text(CONSOLE)
    env = harness.bed_env("ascend-cu130", comfy=comfyui, kitchen=KITCHEN)
    proc = harness.run([str(bed_python), str(script)], env, comfyui)
    out = proc.stdout.splitlines()
    assert proc.returncode == 0 and out[-2:] == ["executed first True", "executed second True"], proc.stderr
    streams = out.index("Using async weight offloading with 2 streams")
    pinned = next(i for i, line in enumerate(out) if line.startswith("Enabled pinned memory "))
    (note,) = [i for i, line in enumerate(out) if line.startswith("ascend_shim turned ComfyUI's")]
    assert note > max(streams, pinned)
    assert out[note].startswith("ascend_shim turned ComfyUI's async weight offloading (2 streams) and pinned "
                                "memory (")
    assert "(NUM_STREAMS=0, MAX_PINNED_MEMORY=-1)" in out[note] and "cudaHostRegister" in out[note]
    assert "torch_npu has streams and host pinning of its own" in out[note] and "910B" in out[note]
    (startup,) = [line for line in out if line.startswith("ascend_shim active on ")]
    (late,) = [i for i, line in enumerate(out) if line.startswith("ascend_shim also patched")]
    assert out.index("executed first True") == late + 1  # said at the end of the first prompt, once
    named = startup.partition(": patched ")[2].split(", ") + out[late].partition(": ")[2].split(", ")
    for name in ("fp8_layer", "attention_account", "fp8_loader_options", "prompt_report", "is_nvidia"):
        assert named.count(name) == 1, (name, named)
    assert "announce" not in named


def test_the_readme_is_one_screen_and_says_what_the_second_command_is():
    """Item 5: what a 910B user needs on one screen, the rest in docs/, in English and 中文."""
    text = (harness.REPO / "README.md").read_text(encoding="utf-8")
    english, _, chinese = text.partition("## 中文说明")
    assert len(english.splitlines()) <= 70, len(english.splitlines())
    first = re.search(r"```bash\n(.*?)```", english, re.S).group(1)
    assert "the project's own test suite" in first and "not needed to use the shim" in first
    assert "本项目自己的测试套件" in re.search(r"```bash\n(.*?)```", chinese, re.S).group(1)
    headings = re.findall(r"^## (.+)$", english, re.M)
    assert headings == ["What it fixes", "Install", "Verify", "Turn off", "Uninstall", "Read on"]
    assert re.findall(r"^### (.+)$", chinese, re.M) == ["解决的问题", "安装", "验证", "关闭", "卸载", "延伸阅读"]
    for topic in ("how-it-works", "fp8", "compatibility", "testbed", "commands", "install"):
        assert "(docs/%s.md)" % topic in english and "(docs/%s.md#中文说明)" % topic in chinese


def test_smaller_untruths(bed_python, comfyui, tmp_path):
    """Item 6, each line true when printed."""
    env = dict(kitchen=KITCHEN)
    # ASCEND_SHIM=0: nothing waits for a follow-up import
    off = shim(bed_python, ["status", "--import", "comfy.model_management"], comfyui,
               harness.bed_env("ascend-cu130", ASCEND_SHIM="0", **env))
    assert " also " not in off.stdout and "(a patch waits for it)" not in off.stdout, off.stdout
    # ASCEND_SHIM_DISABLE='*': no row pending, and a next step that is not this very command
    every = shim(bed_python, ["status", "--import", "comfy.model_management"], comfyui,
                 harness.bed_env("ascend-cu130", ASCEND_SHIM_DISABLE="*", **env))
    rows = table_rows(every.stdout)
    assert {state for state, _ in rows.values()} == {"disabled"}, rows
    assert every.returncode == 0 and " also " not in every.stdout
    assert "next: ASCEND_SHIM_DISABLE leaves every patch out" in flat(every.stdout)
    # an empty PYTORCH_NPU_ALLOC_CONF sets nothing: the shim's expandable segments still apply
    empty = harness.bed_env("ascend-cu130", PYTORCH_NPU_ALLOC_CONF="", **env)
    report = json.loads(shim(bed_python, ["doctor", "--json"], tmp_path, empty).stdout)
    assert report["alloc_conf"] == "expandable_segments:True, set by the shim when ComfyUI starts"
    code = "import os, comfy.model_management; print(repr(os.environ['PYTORCH_NPU_ALLOC_CONF']))"
    empty["PYTHONPATH"] += ":%s" % comfyui
    assert harness.run([str(bed_python), "-c", code], empty, comfyui).stdout.split() == ["'expandable_segments:True'"]
    # every card hidden by ASCEND_RT_VISIBLE_DEVICES is not "nothing to do on this machine"
    hidden = shim(bed_python, ["status"], tmp_path,
                  harness.bed_env("ascend-cu130", TESTBED_NPU_COUNT="0", ASCEND_RT_VISIBLE_DEVICES="7"))
    out = flat(hidden.stdout)
    assert "machine no NPU visible: ASCEND_RT_VISIBLE_DEVICES=7 hides every card" in out
    assert "nothing to do on this machine" not in out and "next: ASCEND_RT_VISIBLE_DEVICES=7 leaves no NPU" in out
    # the bed's NPU is emulated, and status says so
    bed = shim(bed_python, ["status"], tmp_path, harness.bed_env("ascend-cu130"))
    (machine,) = [line for line in bed.stdout.splitlines() if line.startswith("  machine")]
    assert machine.endswith("torch_npu 2.12.0), EMULATED on the host CPU"), machine
    # --import takes one module: its help and the docs say so
    help_text = flat(shim(bed_python, ["status", "--help"], tmp_path, harness.scrubbed_env()).stdout)
    assert "one module per --import, repeat the flag for more" in help_text
    assert "--import MODULE ...]" not in (harness.REPO / "docs" / "commands.md").read_text(encoding="utf-8")
    # doctor on a CPU box outside ComfyUI: no [problem], as the docs promise
    cpu = shim(bed_python, ["doctor"], tmp_path, harness.bed_env("cpu"))
    assert cpu.returncode == 0 and "[problem]" not in cpu.stdout and "[info] ComfyUI not checked" in cpu.stdout
    assert cpu.stdout.rstrip().endswith("no Ascend NPU here, so the shim stays inert; ComfyUI was NOT checked "
                                        "(none here)")


def test_readable_output(bed_python, tmp_path):
    """Item 7: selftest's lines and closing count, status without an NPU, one debug format,
    a bare ``python -m ascend_shim`` (bench's tail: tests/test_cli_output.py's default run)."""
    selftest = shim(bed_python, ["selftest"], tmp_path, harness.bed_env("ascend-cu130"))
    lines = selftest.stdout.splitlines()
    # no comfy-kitchen on this bed: its checks are counted as not run
    assert selftest.returncode == 0 and re.fullmatch(r"selftest: (\d+) of \1 checks passed, \d+ not run "
                                                     r"\(--verbose shows every number\)", lines[-1]), lines[-1]
    ran, skipped = int(lines[-1].split()[1]), int(lines[-1].split(", ")[1].split()[0])
    # a line per check, its verdict's numbers only, never a raw dict
    check_lines = [i for i, line in enumerate(lines) if re.match(r"  \[(PASS|SKIP|FAIL)\] ", line)]
    assert len(check_lines) == ran + skipped
    assert all(b - a <= 2 for a, b in zip(check_lines, check_lines[1:]))  # a long name may wrap once
    assert check_lines[-1] - check_lines[0] + 1 <= len(check_lines) + 3, lines
    assert not [line for line in lines if "{'" in line] and max(len(line) for line in lines) <= 100
    assert lines[2].startswith("EMULATED NPU (its tensors are testbed.npu_device.NpuTensor")
    # no NPU: one line for the patches, not one identical row each
    cpu = shim(bed_python, ["status"], tmp_path, harness.bed_env("cpu")).stdout
    assert re.search(r"^all \d+ patches  inert: never decided here: no NPU, the shim stays inert", cpu, re.M)
    assert not re.search(r"^is_nvidia ", cpu, re.M) and len(cpu.splitlines()) <= 12
    # ASCEND_SHIM_DEBUG=1 under an application's own logging: every shim line in one form
    code = "import logging; logging.basicConfig(level=logging.DEBUG); import comfy.model_management"
    debug = harness.run([str(bed_python), "-c", code],
                        harness.bed_env("ascend-cu130", kitchen=KITCHEN, ASCEND_SHIM_DEBUG="1"),
                        harness.comfyui_dir(COMFYUI))
    assert "ascend_shim: is_nvidia: applied" in debug.stderr.splitlines()
    assert not [line for line in debug.stderr.splitlines() if line.startswith("DEBUG:ascend_shim")]
    bare = shim(bed_python, [], tmp_path, harness.scrubbed_env())
    assert bare.returncode == 0 and "start with: python -m ascend_shim status" in bare.stdout


def test_the_test_bed_tells_how_to_use_it(bed_python, tmp_path):
    """Item 8: --help, several cards, ComfyUI's "Torch already imported" on the bed, and an
    installed shim instead of the checkout's copy (test_newcomer_path runs --installed)."""
    usage = harness.run([str(bed_python), str(harness.TESTBED), "--help"], harness.scrubbed_env(), harness.REPO)
    assert usage.returncode == 0 and "TESTBED_NPU_COUNT=N" in usage.stdout and "--installed" in usage.stdout
    docs = flat((harness.REPO / "docs" / "testbed.md").read_text(encoding="utf-8"))
    assert "TESTBED_NPU_COUNT=N" in docs and "Torch already imported" in docs and "--installed" in docs
    two = harness.run([str(bed_python), str(harness.TESTBED), "run", "ascend-cpu", "--", "python", "-m",
                       "ascend_shim", "status"], harness.scrubbed_env(TESTBED_NPU_COUNT="2"), harness.REPO)
    assert "  machine      2 x Ascend910B3" in two.stdout.splitlines()[2], two.stdout
