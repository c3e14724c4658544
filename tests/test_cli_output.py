"""What the commands print and return, as tools that read it see it.

- ``--json`` is strict JSON: a NaN or infinity becomes ``null`` with the
  reason beside it (``jq`` and JavaScript reject the bare ``NaN``);
- a reader that closes the pipe early (``| head -c1``) does not turn a
  failed check into exit 0;
- ``bench``: ``--json`` without torch is JSON; token counts the device cannot
  hold are a usage error (exit 2), not "a bug in the shim"; timings of an
  emulated NPU (the simulated bed) say so, the default run there is short,
  and progress says how long is left;
- ``--version`` after a command, ``--json`` help on every command.
"""

import json
import re
import subprocess

import pytest

import harness
from ascend_shim.cli import json_report as _json_report
from ascend_shim.commands.bench import layers as bench_layers
from ascend_shim.cli import hardware
from ascend_shim.commands.bench import rope as bench_rope
from ascend_shim.commands import main as cli
from ascend_shim.commands.selftest import report as selftest_report

ZERO_ROW = "all-zero activation row, bf16 bias"


def strict_json(text):
    """``json.loads`` that refuses NaN / Infinity, as strict parsers do."""
    def refuse(constant):
        raise ValueError("not JSON: %s" % constant)

    return json.loads(text, parse_constant=refuse)


def command(python, args, env, tmp_path, timeout=600):
    return harness.run([str(python), "-m", "ascend_shim", *args], env, tmp_path, timeout=timeout)


def with_reader_gone(python, args, env, tmp_path):
    """Run ``args`` with stdout a pipe whose reader closed before the first byte."""
    proc = subprocess.Popen([str(python), "-m", "ascend_shim", *args], env=env, cwd=str(tmp_path),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.close()
    stderr = proc.stderr.read().decode()
    return proc.wait(timeout=600), stderr


# --------------------------------------------------------------------------- strict JSON


def test_the_json_writer_turns_non_finite_numbers_into_null_with_the_reason():
    data = {"cosine": float("nan"), "rows": [1.0, float("inf"), {"ratio": float("-inf")}],
            "nested": {"ok": 0.5, "err": float("nan")}, "flag": True}
    parsed = strict_json(_json_report.dumps(data))
    assert parsed["cosine"] is None and parsed["cosine_not_finite"] == "nan"
    assert parsed["rows"] == [1.0, None, {"ratio": None, "ratio_not_finite": "-inf"}]
    assert parsed["rows_not_finite"] == {"1": "inf"}
    assert parsed["nested"] == {"ok": 0.5, "err": None, "err_not_finite": "nan"}
    assert parsed["flag"] is True


def test_selftest_json_stays_strict_when_a_check_yields_nan(bed_python, tmp_path):
    # the device returns NaN for an all-zero activation row: its cosine is NaN
    env = harness.bed_env("ascend-cu130", kitchen="0.2.40", TESTBED_QMM_CORRUPT="zero_row_nan")
    proc = command(bed_python, ["selftest", "--json"], env, tmp_path)
    assert proc.returncode == 1, proc.stderr
    result = strict_json(proc.stdout)
    check = {c["name"]: c for c in result["checks"]}[ZERO_ROW]
    assert check["passed"] is False
    nulls = {key[:-len("_not_finite")]: value for key, value in check.items() if key.endswith("_not_finite")}
    assert nulls and all(check[key] is None for key in nulls), check

    # the reader leaves at once (`| head -c1`): the failed check still exits 1
    code, stderr = with_reader_gone(bed_python, ["selftest", "--json"], env, tmp_path)
    assert code == 1 and "Traceback" not in stderr and "BrokenPipe" not in stderr, stderr


def test_a_closed_pipe_keeps_the_exit_status_without_an_npu(bed_python, tmp_path):
    env = harness.bed_env(machine=None)
    for args in (["selftest"], ["selftest", "--json"]):
        code, stderr = with_reader_gone(bed_python, args, env, tmp_path)
        assert code == cli.NO_NPU and stderr == "", (args, code, stderr)


# --------------------------------------------------------------------------- bench


def test_bench_json_without_torch_is_json(no_torch_python, tmp_path):
    proc = command(no_torch_python, ["bench", "--json"], harness.scrubbed_env(), tmp_path)
    assert proc.returncode == cli.NO_NPU
    result = strict_json(proc.stdout)
    assert result["npu"] is False and result["rows"] == []
    assert result["reason"].startswith("bench needs torch: ModuleNotFoundError")


@pytest.mark.parametrize("machine", ["ascend-cu130", None])
def test_bench_refuses_token_counts_the_device_cannot_hold(bed_python, tmp_path, machine):
    proc = command(bed_python, ["bench", "--m", "256,99999999999"], harness.bed_env(machine), tmp_path,
                   timeout=120)
    assert proc.returncode == cli.USAGE and proc.stdout == ""
    (line,) = proc.stderr.splitlines()
    assert line.startswith("ascend_shim: bench: --m 99999999999 needs ")
    layers = "|".join(re.escape(name) for name, _, _ in bench_layers.LAYERS)
    assert re.search(r"needs [\d.]+ GiB for layer (%s), more than the [\d.]+ GiB " % layers, line), line
    assert line.endswith("give smaller token counts")
    assert "bug in the shim" not in line


def test_bench_labels_the_timings_of_an_emulated_npu(bed_python, tmp_path):
    env = harness.bed_env("ascend-cu130")
    proc = command(bed_python, ["bench", "--json", "--m", "16", "--repeat", "1", "--warmup", "0"], env, tmp_path)
    result = strict_json(proc.stdout)
    assert proc.returncode == 0 and result["npu"] is True
    # told by the device itself: its tensors are the bed's Python subclass
    assert "testbed.npu_device.NpuTensor, a Python tensor subclass" in result["emulated"]


def test_bench_default_run_on_the_emulated_npu_is_short_and_says_so(bed_python, tmp_path):
    proc = command(bed_python, ["bench"], harness.bed_env("ascend-cu130"), tmp_path)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout.splitlines()
    assert out[0].startswith("EMULATED NPU: its tensors are testbed.npu_device.NpuTensor")
    assert "speed-ups say nothing about a 910B" in out[0]
    assert "| speed-up (emulated) |" in out[1]
    end = out.index("median of 1 run after 0 warm-up, on the emulated device (not an NPU)")
    first = out[1:out.index("")]  # the layer table; the _int_mm table follows it
    rows = [line for line in first if line.startswith("| ") and "layer" not in line]
    assert len(rows) == len(bench_layers.LAYERS) and all(" | 256 | " in row for row in rows)
    # _int_mm both ways, side by side, bit-equal
    int_mm = [line for line in out[len(first) + 1:end] if line.startswith("| 256 | ")]
    assert len(int_mm) == len(bench_layers.INT_MM_SHAPES) and all(line.endswith("| True |") for line in int_mm)
    # the INT8 weight as .t() view, contiguous and NZ side by side, a table to paste into an issue
    layouts = out[end + 1:]
    assert layouts[:3] == ["", "INT8 weight layout, npu_quant_matmul alone, ms (emulated):",
                           "| layer | M | K | N | %s |" % " | ".join(bench_layers.WEIGHT_LAYOUTS)]
    cells = [line.split(" | ")[4:] for line in layouts[4:layouts.index("", 1)]]  # the RoPE table follows
    assert len(cells) == len(bench_layers.LAYERS)
    assert all(re.fullmatch(r"\d+\.\d{3}", cell.strip(" |")) for row in cells for cell in row), layouts
    assert "device synchronised" not in proc.stdout
    # no comfy-kitchen on this bed: the RoPE comparison says why it did not run
    rope = next(i for i, line in enumerate(out) if line.startswith("RoPE, eager vs fused"))
    assert out[rope].startswith("RoPE, eager vs fused: not timed (comfy-kitchen does not import"), out[rope]
    # the fused norm / activation / decoder q/k table needs no comfy-kitchen: every row, timed both ways
    assert out[rope + 2:rope + 4] == ["eager chains vs fused NPU ops, ms (emulated):",
                                      "| case | shape | eager ms | fused ms | speed-up | max difference |"]
    fused = out[rope + 5:]
    assert [row.split(" | ")[0] for row in fused] == ["| " + case for case in (
        "RMSNorm (MiniMax-H3 block)", "SwiGLU before the INT8 fc2 (MiniMax-H3 MLP)",
        "MiniMax-H3 VAE decoder q/k norms + RoPE (fp16)")], fused
    progress = [line for line in proc.stderr.splitlines() if line.startswith("bench: ")]
    assert progress[0] == "bench: 1/4 attention out M=256 K=3840 N=3840"
    assert all(" left" in line for line in progress[1:4]) and progress[3].startswith("bench: 4/4 ")
    # after the layers, what it times next, and when it is done (issue 28 item 7)
    assert progress[4:] == ["bench: layers done; now the _int_mm arithmetics (2 shapes)",
                            "bench: now the weight layouts", "bench: now RoPE",
                            "bench: now RMSNorm and SwiGLU", "bench: done"]


def test_bench_times_kitchens_eager_rope_against_the_fused_one(bed_python, tmp_path):
    env = harness.bed_env("ascend-cu130", kitchen="0.2.27")
    proc = command(bed_python, ["bench", "--json", "--m", "64", "--repeat", "1", "--warmup", "0"], env, tmp_path)
    result = strict_json(proc.stdout)
    assert proc.returncode == 0 and result["rope_not_timed"] == "", proc.stderr
    assert [r["case"] for r in result["rope"]] == [case[0] for case in bench_rope.CASES]
    for row in result["rope"]:
        assert row["tokens"] == 64 and row["eager_ms"] > 0 and row["fused_ms"] > 0, row
        # the same rotation: bf16 outputs of magnitude below 8 differ by at most one rounding
        assert row["max_abs_diff"] <= 2.0 ** -5, row
    assert result["fused_not_timed"] == "" and len(result["fused"]) == 3, result["fused"]
    norm, act, qk = result["fused"]
    assert norm["max_ulps"] == 0 and act["max_ulps"] <= 1, result["fused"]  # the bed's op numerics
    assert norm["fused_ms"] > 0 and act["fused_ms"] > 0 and act["shape"] == [64, 28672]
    # the decoder's q/k glue at one tile's tokens: the patch's gather, norm and rotary give ComfyUI's
    # chain's numbers in the patch's channel order (the norm sums in another order: an fp16 rounding at
    # most, of values below 8, carried through the rotation)
    assert qk["shape"] == [1797, 6144] and qk["eager_ms"] > 0 and qk["fused_ms"] > 0, qk
    assert qk["max_abs_diff"] <= 2.0 ** -7, qk


def test_a_real_device_backend_is_not_taken_for_an_emulation():
    import torch

    assert hardware.emulation(torch, torch.device("cpu")) is None


def test_bench_memory_need_counts_every_tensor_of_a_measurement():
    m, k, n = 10, 20, 30
    # weight + scale + its bf16 copy, x + codes + per-token scales, two bf16 outputs
    assert bench_layers.layer_bytes(m, k, n, True) == n * k + n * 4 + n * k * 2 + m * k * 3 + m * 4 + 2 * m * n * 2
    assert bench_layers.layer_bytes(m, k, n, False) == n * k + n * 4 + m * k * 3 + m * 4 + m * n * 2


# --------------------------------------------------------------------------- the command line


@pytest.mark.parametrize("name", ["status", "doctor", "selftest", "bench"])
def test_version_after_any_command(name, capsys):
    with pytest.raises(SystemExit) as exit:
        cli.main([name, "--version"])
    assert exit.value.code == 0
    assert capsys.readouterr().out.strip() == "ascend_shim %s" % cli.__version__


@pytest.mark.parametrize("name", ["status", "doctor", "selftest", "bench"])
def test_json_has_help_on_every_command(name):
    parser = cli.build_parser()
    (sub,) = [a for a in parser._actions if a.dest == "command"]
    (option,) = [a for a in sub.choices[name]._actions if "--json" in a.option_strings]
    assert option.help and "machine-readable" in option.help


def test_skipped_checks_are_listed_as_not_checked():
    checks = [{"name": "a", "passed": True}, {"name": "b", "passed": True, "skipped": "why"},
              {"name": "c", "passed": True, "skipped": "why"}]
    assert selftest_report.not_checked(checks) == {"why": ["b", "c"]}
