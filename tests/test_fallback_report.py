"""CPU-fallback reporting: what torch_npu prints, and what ``status`` says about it.

torch_npu's fallback warning is not a Python warning: its ``warn_`` hands the
text to a c10 WarningHandler of its own, which writes one C++ log line to
stderr, once per op (the bed writes it the same way). So Python's warning
settings neither hide it from the console nor let the shim see it, and
``status`` must not claim "none" on an NPU. Each scenario runs in a fresh
interpreter on the simulated 910B, with the shim's own ``_int_mm`` kernel
switched off so that ``aten::_int_mm`` reaches torch_npu's CPU fallback.
"""

import json
import re
import sys
import textwrap

import harness
import pytest



def torch_npu_line(op):
    """torch_npu's line as c10's logger writes it (VariableFallbackKernel.cpp, npu_cpu_fallback)."""
    return re.compile(
        r"^\[W\d{3,4} \d\d:\d\d:\d\d\.\d{9} VariableFallbackKernel\.cpp:\d+\] Warning: CAUTION: The operator "
        r"'%s' is not currently supported on the NPU backend and will fall back to run on the CPU\. "
        r"This may have performance implications\. \(function npu_cpu_fallback\)$" % re.escape(op), re.M)


TORCH_NPU_LINE = torch_npu_line("aten::_int_mm")
NOT_VISIBLE = "CPU fallbacks: not visible to the shim; torch_npu reports each op once on stderr"

SCENARIO = """
import json, logging, warnings
{setup}
import torch, torch_npu
x = torch.ones(4, 8, dtype=torch.int8, device="npu")
{run}
from ascend_shim.commands.status import command as status_cmd
text = status_cmd.render(status_cmd.collect([]), False)
print(json.dumps({{"status": " ".join(text.split()), "rows": {{r["name"]: r["state"] for r in
                  __import__("ascend_shim").status()["patches"]}}}}))
"""
RUN = "for _ in range(3):\n    torch._int_mm(x, x.t().contiguous())"
IN_BLOCK = "with warnings.catch_warnings():\n    warnings.simplefilter('ignore')\n" + textwrap.indent(RUN, "    ")

# name -> (code before torch is imported, code that runs the op, interpreter flags, environment)
SETTINGS = {
    "defaults": ("", RUN, (), {}),
    "filterwarnings ignore UserWarning": ('warnings.filterwarnings("ignore", category=UserWarning)', RUN, (), {}),
    "logging.captureWarnings": ("logging.captureWarnings(True)", RUN, (), {}),
    "simplefilter ignore": ('warnings.simplefilter("ignore")', RUN, (), {}),
    "PYTHONWARNINGS=ignore": ("", RUN, (), {"PYTHONWARNINGS": "ignore"}),
    "-W ignore": ("", RUN, ("-W", "ignore"), {}),
    "catch_warnings block": ("", IN_BLOCK, (), {}),
}


@pytest.fixture
def fallback_run(bed_python, tmp_path):
    """fallback_run(setup, run, flags, env) -> (stdout JSON, stderr) of a fresh interpreter."""

    def runner(setup, run, flags=(), env=None):
        script = tmp_path / "scenario.py"
        script.write_text(SCENARIO.format(setup=setup, run=run))
        proc = harness.run([str(bed_python), *flags, str(script)],
                           harness.bed_env("ascend-cu130", ASCEND_SHIM_DISABLE="int_mm", **(env or {})),
                           tmp_path)
        return harness.last_json(proc), proc.stderr

    return runner


@pytest.mark.parametrize("setting", list(SETTINGS))
def test_status_is_true_about_fallbacks_under_warning_settings(fallback_run, setting):
    setup, run, flags, env = SETTINGS[setting]
    result, stderr = fallback_run(setup, run, flags, env)
    assert result["rows"]["cpu_fallbacks"] == "applied" and result["rows"]["int_mm"] != "applied", result
    # the user's warning settings do not hide torch_npu's C++ line: it is on stderr, once
    assert len(TORCH_NPU_LINE.findall(stderr)) == 1, stderr
    # and status says where fallbacks show, never "none" (the shim cannot see that line)
    assert NOT_VISIBLE in result["status"], result["status"]
    assert "CPU fallbacks seen: none" not in result["status"]


@pytest.mark.parametrize("env, named", [({"TORCH_NPU_WARNING_DISABLE": "1"}, "TORCH_NPU_WARNING_DISABLE=1"),
                                        ({"RANK": "1"}, "RANK=1"),
                                        ({"TORCH_CPP_LOG_LEVEL": "ERROR"}, "TORCH_CPP_LOG_LEVEL=ERROR")])
def test_status_says_fallbacks_go_unreported_when_torch_npu_is_silenced(fallback_run, env, named):
    result, stderr = fallback_run("", RUN, (), env)
    assert not TORCH_NPU_LINE.search(stderr) and "fall back" not in stderr, stderr
    assert ("CPU fallbacks: not visible to the shim, and torch_npu's own warning is off here (%s" % named
            in result["status"]), result["status"]
    assert "an op that runs on the CPU goes unreported" in result["status"]


SELFTEST = """
import sys
from testbed import npu_device
npu_device.set_cpu_fallback_ops({"aten::mm"})  # a device with no kernel for aten::mm
from ascend_shim.commands import main as cli
sys.exit(cli.main(["selftest", "--json"]))
"""


def test_selftest_fails_on_a_fallback_torch_npu_reports_on_stderr(bed_python, tmp_path):
    script = tmp_path / "selftest.py"
    script.write_text(SELFTEST)
    proc = harness.run([str(bed_python), str(script)], harness.bed_env("ascend-cu130", kitchen="0.2.26"), tmp_path)
    result = json.loads(proc.stdout)
    assert proc.returncode == 1 and result["passed"] is False, proc.stderr
    assert result["checks"][-1] == {"name": "no CPU fallback", "fallbacks": ["aten::mm"], "passed": False}
    assert [c["name"] for c in result["checks"] if not c["passed"]] == ["no CPU fallback"]
    # what selftest read from stderr still reaches the console
    assert len(torch_npu_line("aten::mm").findall(proc.stderr)) == 1, proc.stderr


def test_status_without_an_npu_says_none(run_bed):
    code = """
    import json
    from ascend_shim.commands.status import command as status_cmd
    text = status_cmd.render(status_cmd.collect([]), False)
    print(json.dumps([line for line in text.splitlines() if "CPU fallbacks" in line]))
    """
    assert harness.last_json(run_bed(code, machine="cpu")) == ["CPU fallbacks seen: none"]


def test_which_settings_silence_torch_npu():
    from ascend_shim.engine.fallback_report import native_line_off

    assert native_line_off({}) is None
    assert native_line_off({"TORCH_NPU_WARNING_DISABLE": "1"}) == "TORCH_NPU_WARNING_DISABLE=1"
    assert native_line_off({"TORCH_NPU_WARNING_DISABLE": " 1x"}) == "TORCH_NPU_WARNING_DISABLE= 1x"  # strtol
    assert native_line_off({"TORCH_NPU_DISABLED_WARNING": "1"}) == "TORCH_NPU_DISABLED_WARNING=1"
    # torch_npu reads the older name only when the newer one is unset
    assert native_line_off({"TORCH_NPU_WARNING_DISABLE": "0", "TORCH_NPU_DISABLED_WARNING": "1"}) is None
    assert native_line_off({"TORCH_NPU_WARNING_DISABLE": "true"}) is None
    assert native_line_off({"RANK": "0"}) is None and native_line_off({"RANK": "-1"}) is None
    assert native_line_off({"RANK": "2"}).startswith("RANK=2")
    assert native_line_off({"TORCH_CPP_LOG_LEVEL": "warning"}) is None
    assert native_line_off({"TORCH_CPP_LOG_LEVEL": "3"}) == "TORCH_CPP_LOG_LEVEL=3"
    assert native_line_off({"TORCH_CPP_LOG_LEVEL": " error"}) is None  # c10 cannot parse it: WARNING


NATIVE = """
import json, os, sys
from ascend_shim.engine.fallback_report import native_fallbacks
line = sys.argv[1] + "\\n"
with native_fallbacks() as ops:
    sys.stderr.write("before\\n")
    os.write(2, line.encode())
    sys.stderr.write("after\\n")
    held = ops == []
print(json.dumps({"ops": ops, "held": held}))
"""


def test_native_fallbacks_reads_fd_2_and_passes_it_on(tmp_path):
    line = ("[W1201 21:38:16.125933472 VariableFallbackKernel.cpp:250] Warning: CAUTION: The operator "
            "'aten::foo' is not currently supported on the NPU backend and will fall back to run on the CPU. "
            "This may have performance implications. (function npu_cpu_fallback)")
    proc = harness.run([sys.executable, "-c", NATIVE, line], harness.scrubbed_env(PYTHONPATH=harness.REPO),
                       tmp_path)
    assert harness.last_json(proc) == {"ops": ["aten::foo"], "held": True}
    assert proc.stderr == "before\n%s\nafter\n" % line  # all of it, in order, once the block ends


def test_native_fallbacks_without_stderr(tmp_path):
    code = ("import sys\nfrom ascend_shim.engine.fallback_report import native_fallbacks\n"
            "with native_fallbacks() as ops:\n    pass\nprint(ops)\n")
    proc = harness.run(["sh", "-c", '"$0" -c "$1" 2>&-', sys.executable, code],
                       harness.scrubbed_env(PYTHONPATH=harness.REPO), tmp_path)
    assert proc.returncode == 0 and proc.stdout == "[]\n", proc


def test_report_parses_the_warning_text():
    from ascend_shim.engine import fallback_report

    fallback_report.reset()
    text = ("CAUTION: The operator 'aten::_int_mm' is not currently supported on the NPU backend and "
            "will fall back to run on the CPU. This may have performance implications.")
    assert fallback_report.record(text, "quantization.py", 754) == "aten::_int_mm"
    assert fallback_report.record("some other warning") is None
    assert fallback_report.record(text.replace("_int_mm", "_foreach_add")) == "aten::_foreach_add"
    report = fallback_report.report()
    assert sorted(report) == ["aten::_foreach_add", "aten::_int_mm"]
    assert report["aten::_int_mm"]["where"] == "quantization.py:754"
    assert fallback_report.unannounced() == ["aten::_foreach_add", "aten::_int_mm"]
    assert fallback_report.unannounced() == []
    # what the shim did see is listed as seen, on any machine
    assert fallback_report.status_lines(fallback_report.report(), True, {}) == [
        "CPU fallbacks seen: aten::_foreach_add, aten::_int_mm"]
    fallback_report.reset()
