"""status / doctor / selftest / bench at the process boundary: no torch, CPU torch, simulated NPU."""

import json

import pytest

import harness

DOCTOR_KEYS = {"python", "torch", "torch_npu", "cann", "npu", "comfy_kitchen", "comfyui", "shim",
               "environment", "findings", "ok"}
STATUS_KEYS = {"shim", "patches", "int8", "cpu_fallbacks"}
PATCH_KEYS = {"name", "target", "summary", "state", "reason", "late", "in_place", "version"}


def cli(python, args, cwd, env):
    return harness.run([str(python), "-m", "ascend_shim", *args], env, cwd, timeout=300)


def as_json(proc):
    return json.loads(proc.stdout)


@pytest.fixture
def no_torch_python(venv_for):
    python = venv_for("3.12")
    probe = harness.run([str(python), "-c", "import torch"], harness.scrubbed_env(), python.parent)
    assert probe.returncode != 0, "this venv must not see torch"
    return python


def test_without_torch(no_torch_python, tmp_path):
    env = harness.scrubbed_env()
    status = cli(no_torch_python, ["status", "--json"], tmp_path, env)
    assert status.returncode == 0 and set(as_json(status)) == STATUS_KEYS
    assert all(set(row) == PATCH_KEYS for row in as_json(status)["patches"])
    doctor = cli(no_torch_python, ["doctor", "--json"], tmp_path, env)
    report = as_json(doctor)
    assert set(report) == DOCTOR_KEYS
    assert doctor.returncode == 1 and report["ok"] is False
    assert report["torch"]["installed"] is False
    assert [f["what"] for f in report["findings"] if f["severity"] == "problem"] == \
        ["torch is not installed in this interpreter"]
    assert report["shim"]["active"] is True and report["shim"]["pth"]
    text = cli(no_torch_python, ["doctor"], tmp_path, env)
    assert "[problem] torch is not installed in this interpreter" in text.stdout
    selftest = cli(no_torch_python, ["selftest"], tmp_path, env)
    assert selftest.returncode == 3 and "selftest needs an Ascend NPU" in selftest.stdout


def test_with_cpu_torch(bed_python, tmp_path):
    env = harness.bed_env(machine=None)
    report = as_json(cli(bed_python, ["doctor", "--json"], tmp_path, env))
    assert set(report) == DOCTOR_KEYS
    assert report["ok"] is True and report["torch"]["installed"] is True
    assert report["torch_npu"]["installed"] is False and report["npu"]["available"] is False
    status = as_json(cli(bed_python, ["status", "--json"], tmp_path, env))
    assert set(status) == STATUS_KEYS and status["shim"]["finder_installed"] is True
    bench = cli(bed_python, ["bench", "--m", "16", "--repeat", "2", "--warmup", "1"], tmp_path, env)
    assert bench.returncode == 0 and "host overhead only" in bench.stdout
    assert bench.stdout.count("| 16 |") == 4


def test_on_the_simulated_npu(bed_python, tmp_path):
    comfy = harness.COMFY_FAKES / "v0_29"
    env = harness.bed_env("ascend-cu130", kitchen="0.2.40")
    doctor = cli(bed_python, ["doctor", "--json", "--comfyui", str(comfy)], tmp_path, env)
    report = as_json(doctor)
    assert set(report) == DOCTOR_KEYS and doctor.returncode == 0
    assert report["npu"] == {"available": True, "count": 1, "name": "Ascend910B3"}
    assert report["torch"]["cuda_build"] is True
    assert report["torch_npu"]["quant_ops"] == {"npu_dynamic_quant": True, "npu_quant_matmul": True}
    assert report["cann"] == "9.1.0-beta.1"
    assert report["comfy_kitchen"]["version"] == "0.2.40"
    assert report["comfy_kitchen"]["upstream_ascend_backend"] is True
    assert report["comfyui"]["version"] == "0.30.2"
    assert [f for f in report["findings"] if f["severity"] == "problem"] == []

    off = cli(bed_python, ["doctor", "--json"], tmp_path, dict(env, ASCEND_SHIM="0"))
    problems = [f["what"] for f in as_json(off)["findings"] if f["severity"] == "problem"]
    assert off.returncode == 1
    assert any("CUDA build on an NPU machine" in p for p in problems)

    status = as_json(cli(bed_python, ["status", "--json", "--import", "comfy_kitchen"], tmp_path, env))
    rows = {row["name"]: row for row in status["patches"]}
    assert rows["kitchen_int8"]["state"] == "applied" and rows["kitchen_int8"]["version"] == "0.2.40"
    assert status["int8"]["priority"][:3] == ["ascend", "ascend_shim", "ascend_shim_fallback"]


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
    assert data["npu"] is True and len(data["rows"]) == 4
    assert all(row["int8_ms"] > 0 and row["bf16_ms"] > 0 for row in data["rows"])


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
from ascend_shim import cli
sys.exit(cli.main(["selftest"]))
"""
    proc = harness.run([str(bed_python), "-c", code], env, tmp_path)
    assert proc.returncode == 1
    assert "[FAIL] int8_linear M=64 K=3840 N=3840" in proc.stdout
