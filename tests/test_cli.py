"""status / selftest / bench and the CLI's conventions, at the process boundary.

No torch, CPU torch and the simulated NPU; every command as a user runs it.
``doctor`` has its own file, tests/test_doctor.py.
"""

import json
import os
import re
import subprocess

import pytest

import harness

# "reports": the names of the sections the patches declare (int8 ... cpu_fallbacks)
STATUS_KEYS = {"shim", "patches", "reports", "int8", "w4a8", "rope", "int_mm", "rms_norm", "fp8", "attention",
               "cpu_fallbacks", "sampler_ops", "audit", "model_moves", "host_dispatch", "startup", "machine",
               "imports", "kitchen_in_use"}
# what status shows of each patch (the engine may report more)
PATCH_KEYS = {"name", "target", "summary", "state", "reason", "late", "in_place", "version",
              "waiting_for", "detail"}


def cli(python, args, cwd, env):
    return harness.run([str(python), "-m", "ascend_shim", *args], env, cwd, timeout=300)


def as_json(proc):
    return json.loads(proc.stdout)


def no_traceback(proc):
    return "Traceback" not in proc.stderr and "Traceback" not in proc.stdout


def test_quick_start_status_without_torch(no_torch_python, tmp_path):
    """The README's first command: installed, no NPU, what next; no blank reasons."""
    proc = cli(no_torch_python, ["status"], tmp_path, harness.scrubbed_env())
    assert proc.returncode == 0 and proc.stderr == ""
    lines = proc.stdout.splitlines()
    assert "  import hook  installed at startup (ascend_shim.pth)" in lines
    assert ("  machine      no NPU: torch is not installed in this interpreter, "
            "the shim will stay inert") in lines
    assert lines[-1].startswith("next: nothing to do on this machine")
    assert max(len(line) for line in lines) <= 100
    # no NPU: nothing is waiting for anything (issue 18, item 12), said once for every patch (issue 28)
    (said,) = [line for line in lines if line.startswith("all ")]
    assert re.fullmatch(r"all \d+ patches  inert: never decided here: no NPU, the shim stays inert "
                        r"\(--verbose lists them\)", said), said
    assert not [line for line in lines if " pending " in line]

    data = as_json(cli(no_torch_python, ["status", "--json"], tmp_path, harness.scrubbed_env()))
    assert set(data) == STATUS_KEYS
    assert sorted(data["reports"]) == ["attention", "audit", "cpu_fallbacks", "fp8", "host_dispatch", "int8", "int_mm",
                                       "model_moves", "rms_norm", "rope", "sampler_ops", "w4a8"]
    # never a bare {} that reads as "no fallbacks": nothing could see them here
    assert data["cpu_fallbacks"]["visible"] is False and data["cpu_fallbacks"]["seen"] == {}
    assert data["audit"]["on"] is False and data["audit"]["saved"] is None
    assert all(PATCH_KEYS <= set(row) for row in data["patches"])
    pending = [row for row in data["patches"] if row["state"] == "pending"]
    assert pending and all(row["waiting_for"] and row["shown_state"] == "inert" for row in pending)
    assert data["startup"]["active"] is True and data["machine"]["npu"] is False


def test_status_when_switched_off_says_so(no_torch_python, tmp_path):
    proc = cli(no_torch_python, ["status"], tmp_path, harness.scrubbed_env(ASCEND_SHIM="0"))
    assert proc.returncode == 0
    assert "  import hook  NOT installed at startup: switched off by ASCEND_SHIM=0" in proc.stdout
    assert proc.stdout.splitlines()[-1] == "next: unset ASCEND_SHIM to switch the shim back on"


def test_status_import_when_switched_off_says_why_nothing_is_patched(bed_python, tmp_path):
    env = harness.bed_env("ascend-cu130", comfy=str(harness.comfyui_dir(harness.COMFYUI_USER)),
                          kitchen=harness.COMFYUI_USER_KITCHEN, ASCEND_SHIM="0")
    data = as_json(cli(bed_python, ["status", "--json", "--import", "comfy.model_management"],
                       tmp_path, env))
    row = {r["name"]: r for r in data["patches"]}["is_nvidia"]
    assert row["state"] == "pending" and row["waiting_for"] == []
    assert row["detail"] == "not patched: switched off by ASCEND_SHIM=0"


def test_status_on_the_npu_names_the_machine_and_the_next_step(bed_python, tmp_path):
    proc = cli(bed_python, ["status"], tmp_path, harness.bed_env("ascend-cu130"))
    assert proc.returncode == 0
    assert "  machine      1 x Ascend910B3 (torch " in proc.stdout
    next_step = " ".join(proc.stdout.split("\nnext: ")[-1].split())
    assert "status --import comfy.model_management" in next_step
    assert max(len(line) for line in proc.stdout.splitlines()) <= 100
    rows = {line.split()[0]: line.split()[2] for line in proc.stdout.splitlines()
            if line.split()[:2] and line.split()[1:2] == ["torch_npu"]}
    # status imported torch_npu to see the machine: its patches decided, and the table says so
    assert rows["int_mm"] == "applied" and rows["cpu_fallbacks"] == "applied", rows
    assert rows["sampler_ops"] == "applied", rows


def test_status_names_the_ops_served_instead_of_torch_npus_fallback(bed_python, tmp_path):
    env = harness.bed_env("ascend-cu130")
    data = as_json(cli(bed_python, ["status", "--json"], tmp_path, env))
    served = ["aten::_linalg_solve_ex", "aten::lgamma", "aten::lgamma_"]
    assert data["sampler_ops"]["registered"] == served, data["sampler_ops"]
    text = " ".join(cli(bed_python, ["status"], tmp_path, env).stdout.split())
    assert ("served on the NPU by the shim instead of torch_npu's CPU fallback: aten::_linalg_solve_ex "
            "(0 calls), aten::lgamma (0 calls), aten::lgamma_ (0 calls)") in text, text
    off = harness.bed_env("ascend-cu130", ASCEND_SHIM_DISABLE="sampler_ops")
    assert as_json(cli(bed_python, ["status", "--json"], tmp_path, off))["sampler_ops"] is None


@pytest.mark.parametrize("int32_output, path, why", [
    ("exact", "npu_quant_matmul int32 (INT8 cube)", "exact int32 probe product"),
    ("refused", "fp32 GEMMs over K-chunks", "refused int32 output"),
    ("fp32-rounded", "fp32 GEMMs over K-chunks", "inexact"),
])
def test_status_says_which_arithmetic_serves_int_mm(bed_python, tmp_path, int32_output, path, why):
    env = harness.bed_env("ascend-cu130", TESTBED_QMM_INT32=int32_output)
    data = as_json(cli(bed_python, ["status", "--json"], tmp_path, env))
    assert data["int_mm"]["path"] == path and why in data["int_mm"]["why"], data["int_mm"]
    text = cli(bed_python, ["status"], tmp_path, env).stdout
    assert "    by %s: " % path in text and why in " ".join(text.split()), text


def test_status_import_brings_in_what_the_patches_wait_for(bed_python, tmp_path):
    """The real 0.3.45: mmap and announce wait for comfy.utils, which ComfyUI imports at start."""
    env = harness.bed_env("ascend-cu130", comfy=str(harness.comfyui_dir("0.3.45")))
    data = as_json(cli(bed_python, ["status", "--json", "--import", "comfy.model_management"],
                       tmp_path, env))
    assert data["imports"]["asked"] == {"comfy.model_management": None}
    followed = data["imports"]["followed"]
    assert followed["comfy.utils"] is None
    # a follow-up import may lack only what some test venvs cannot hold for their torch
    unbuildable = {"ModuleNotFoundError: No module named '%s'" % name for name in ("torchvision", "torchaudio")}
    assert all(name.startswith("comfy.") and error in {None, "not in this version"} | unbuildable
               for name, error in followed.items()), followed
    missing = [name for name, error in followed.items() if error in unbuildable]
    rows = {row["name"]: row for row in data["patches"]}
    assert rows["mmap"]["state"] == "applied" and rows["announce"]["state"] == "applied"
    assert rows["is_nvidia"]["state"] == "applied"
    table = cli(bed_python, ["status", "--import", "comfy.model_management"], tmp_path, env)
    assert table.returncode == (1 if missing else 0)
    assert "  also         comfy.utils (a patch waits for it)" in table.stdout
    assert max(len(line) for line in table.stdout.splitlines()) <= 100
    verbose = cli(bed_python, ["status", "-v", "--import", "comfy.model_management"], tmp_path, env)
    assert "is_nvidia on comfy.model_management: applied" in verbose.stdout
    assert max(len(line) for line in verbose.stdout.splitlines()) <= 100


def test_status_import_failure_exits_1(bed_python, tmp_path):
    proc = cli(bed_python, ["status", "--import", "no_such_module_here"], tmp_path,
               harness.bed_env("ascend-cu130"))
    assert proc.returncode == 1 and no_traceback(proc)
    assert "could not import no_such_module_here: ModuleNotFoundError" in proc.stderr
    assert "  imported     no_such_module_here  FAILED: ModuleNotFoundError" in proc.stdout


def test_status_alloc_conf_tells_when_torch_npu_does_not_import(bed_python, tmp_path):
    env = harness.bed_env("ascend-cpu", comfy=str(harness.comfyui_dir(harness.COMFYUI_USER)), kitchen=harness.COMFYUI_USER_KITCHEN,
                          TESTBED_TORCH_NPU_IMPORT_ERROR="libhccl.so: cannot open shared object file")
    data = as_json(cli(bed_python, ["status", "--json", "--import", "comfy"], tmp_path, env))
    row = {r["name"]: r for r in data["patches"]}["alloc_conf"]
    assert row["state"] == "applied"
    assert row["detail"].endswith("but no effect: torch_npu does not import "
                                  "(ImportError: libhccl.so: cannot open shared object file)")


@pytest.mark.parametrize("reader", ["head -2", "true"])
def test_status_into_a_closed_pipe_is_quiet(bed_python, tmp_path, reader):
    command = "'%s' -m ascend_shim status; echo \"rc=$?\" >&2" % bed_python
    proc = subprocess.run(["bash", "-c", "{ %s; } | %s" % (command, reader)], cwd=str(tmp_path),
                          env=harness.bed_env("ascend-cu130"), capture_output=True, text=True,
                          timeout=300)
    assert proc.stderr.strip().splitlines() == ["rc=0"]


@pytest.mark.parametrize("args, message", [
    (["--m", "abc"], "argument --m: 'abc' is not a token count >= 1"),
    (["--m", "0"], "argument --m: '0' is not a token count >= 1"),
    (["--m", "16,"], "argument --m: '16,': give comma-separated whole numbers"),
    (["--repeat", "0"], "argument --repeat: '0' is not a whole number >= 1"),
    (["--warmup", "-3"], "argument --warmup: '-3' is not a whole number >= 0"),
])
def test_bad_bench_options_are_usage_errors(no_torch_python, tmp_path, args, message):
    proc = cli(no_torch_python, ["bench", *args], tmp_path, harness.scrubbed_env())
    assert proc.returncode == 2 and no_traceback(proc)
    assert message in proc.stderr and "usage:" in proc.stderr


def test_no_npu_exit_code_is_3_for_selftest_and_bench(no_torch_python, bed_python, tmp_path):
    selftest = cli(no_torch_python, ["selftest"], tmp_path, harness.scrubbed_env())
    assert selftest.returncode == 3 and "selftest needs an Ascend NPU" in selftest.stdout
    bench = cli(bed_python, ["bench", "--m", "16", "--repeat", "2", "--warmup", "1"], tmp_path,
                harness.bed_env(machine=None))
    assert bench.returncode == 3 and "host overhead only" in bench.stdout
    assert bench.stdout.count("| 16 |") == 4
    assert "bench: 1/4 attention out M=16 K=3840 N=3840" in bench.stderr.splitlines()


def test_internal_error_is_one_line_and_exit_4(bed_python, tmp_path):
    code = ("import sys\nfrom ascend_shim.commands import main as cli\n"
            "from ascend_shim.commands.status import command as status_cmd\n"
            "def broken(options):\n    raise KeyError('boom')\n"
            "status_cmd.main = broken\nsys.exit(cli.main(['status']))\n")
    proc = harness.run([str(bed_python), "-c", code], harness.bed_env(machine=None), tmp_path)
    assert proc.returncode == 4 and no_traceback(proc)
    assert proc.stderr.startswith("ascend_shim: status failed: KeyError: 'boom' (this is a bug")


def test_console_script_is_installed(no_torch_python, tmp_path):
    script = os.path.join(os.path.dirname(str(no_torch_python)), "ascend-shim")
    proc = harness.run([script, "status"], harness.scrubbed_env(), tmp_path)
    assert proc.returncode == 0 and "import hook  installed at startup" in proc.stdout


def test_selftest_and_bench_end_to_end_on_the_bed(bed_python, tmp_path):
    env = harness.bed_env("ascend-cu130", kitchen="0.2.26")
    selftest = cli(bed_python, ["selftest", "--json"], tmp_path, env)
    result = as_json(selftest)
    assert selftest.returncode == 0 and result["passed"] is True and result["npu"] is True
    names = [check["name"] for check in result["checks"]]
    assert names[0] == "dynamic quant + quant matmul" and names[-1] == "no CPU fallback"
    kitchen = [c for c in result["checks"] if c["name"] == "comfy-kitchen int8_linear"][0]
    assert kitchen["backend"] == "ascend_shim"
    for check in result["checks"]:
        if "cosine" in check:
            assert check["cosine"] >= 0.9999 and check["rel_mae"] <= 0.02

    bench = cli(bed_python, ["bench", "--json", "--m", "16", "--repeat", "1", "--warmup", "0"], tmp_path, env)
    data = as_json(bench)
    assert bench.returncode == 0
    assert data["npu"] is True and len(data["rows"]) == 4
    assert all(row["int8_ms"] > 0 and row["bf16_ms"] > 0 for row in data["rows"])
    ops = [row["op"] for row in data["sampler_ops"]]
    assert ops == ["linalg.solve sa_solver vandermonde 4x4", "linalg.solve sa_solver vandermonde 6x6",
                   "linalg.solve uni_pc R 3x3", "lgamma 1..6 (sa_solver)"]
    assert all(row["shim_ms"] > 0 and row["host_ms"] > 0 and row["max_diff"] < 1e-4 for row in data["sampler_ops"])
    # the _int_mm kernel's two arithmetics, side by side, agreeing bit for bit
    assert [(r["M"], r["K"], r["N"]) for r in data["int_mm"]] == [(16, 3840, 3840), (16, 3840, 10240)]
    assert all(r["fp32_chunks_ms"] > 0 and r["int8_cube_ms"] > 0 and r["equal"] for r in data["int_mm"])


def test_selftest_fails_when_the_int8_path_is_wrong(bed_python, tmp_path):
    """A device whose quant matmul ignores pertoken scales must fail the selftest."""
    env = harness.bed_env("ascend-cu130")
    code = """
import sys, torch_npu
real = torch_npu.npu_quant_matmul
def broken(*args, **kwargs):
    kwargs.pop("pertoken_scale", None)
    return real(*args, **kwargs)
torch_npu.npu_quant_matmul = broken
from ascend_shim.commands import main as cli
sys.exit(cli.main(["selftest"]))
"""
    proc = harness.run([str(bed_python), "-c", code], env, tmp_path)
    assert proc.returncode == 1
    assert "[FAIL] int8_linear M=64 K=3840 N=3840" in proc.stdout


def test_status_json_stays_json_when_an_imported_module_prints(bed_python, tmp_path):
    (tmp_path / "chatty.py").write_text("print('hello from chatty')\n")
    env = harness.bed_env("ascend-cu130", extra_path=[tmp_path])
    proc = cli(bed_python, ["status", "--json", "--import", "chatty"], tmp_path, env)
    assert proc.returncode == 0 and no_traceback(proc)
    assert as_json(proc)["imports"]["asked"] == {"chatty": None}
    assert "hello from chatty" in proc.stderr
    # a module that is not ComfyUI: the next step still points at ComfyUI
    text = cli(bed_python, ["status", "--import", "chatty"], tmp_path, env).stdout
    assert "status --import comfy.model_management" in " ".join(text.split("\nnext: ")[-1].split())


def test_closed_or_narrow_stdout_is_not_an_internal_error(bed_python, tmp_path):
    comfy = tmp_path / "ComfyUI"  # the users' release v0.30.0, linked, with a version file of its own
    comfy.mkdir()
    for entry in harness.comfyui_dir(harness.COMFYUI_USER).iterdir():
        if entry.name != "comfyui_version.py":
            (comfy / entry.name).symlink_to(entry)
    (comfy / "comfyui_version.py").write_text('__version__ = "0.30.2-昇腾"\n', encoding="utf-8")
    # torchvision/torchaudio that import (stand-ins where this venv has no build): ComfyUI starts
    starts = [harness.stand_ins(tmp_path / "stand-ins", bed_python)]
    env = harness.bed_env("ascend-cu130", comfy=str(comfy), kitchen="0.2.40", PYTHONIOENCODING="ascii",
                          extra_path=starts)
    narrow = cli(bed_python, ["doctor", "--comfyui", str(comfy)], tmp_path, env)
    assert narrow.returncode == 0 and no_traceback(narrow), narrow.stderr
    assert "0.30.2-\\u6607\\u817e" in narrow.stdout
    code = "import sys, os; os.close(1); sys.stdout = None; from ascend_shim.commands import main as cli; sys.exit(cli.main(%r))"
    for args in (["status"], ["doctor", "--json", "--comfyui", str(comfy)]):
        closed = harness.run([str(bed_python), "-c", code % (args,)],
                             harness.bed_env("ascend-cu130", kitchen="0.2.40", extra_path=starts), tmp_path)
        assert closed.returncode == 0 and closed.stderr == "", (args, closed.stderr)


def test_version_option(bed_python, tmp_path):
    import ascend_shim

    proc = cli(bed_python, ["--version"], tmp_path, harness.bed_env(machine=None))
    assert proc.returncode == 0 and proc.stdout.strip() == "ascend_shim %s" % ascend_shim.__version__
