"""ascend_shim.patches.comfyui.fp8.effective from the settings alone, as doctor and status show it.

The live decision (which NPU INT8 path serves the layers) runs on the bed
with real ComfyUI in tests/patches/test_fp8_real.py.
"""

import json

import pytest

import harness
from ascend_shim.startup import config as _config
from ascend_shim.patches.comfyui.fp8 import effective as fp8_effective
from ascend_shim.commands.status import sections as reports

NAMED = "no NPU INT8 path is registered, so fp8 weights are decoded to bf16"


@pytest.mark.parametrize("env, upstream, gap", [
    ({"ASCEND_SHIM_FP8": "int8", "ASCEND_SHIM_INT8": "off"}, False, None),  # eager reaches the _int_mm kernel
    ({"ASCEND_SHIM_FP8": "int8", "ASCEND_SHIM_INT8": "off", "ASCEND_SHIM_DISABLE": "int_mm"}, False,
     "ASCEND_SHIM_INT8=off and ASCEND_SHIM_DISABLE naming int_mm"),
    ({"ASCEND_SHIM_FP8": "int8", "ASCEND_SHIM_DISABLE": "int_mm,kitchen_int8"}, False,
     "ASCEND_SHIM_DISABLE naming kitchen_int8 and int_mm"),
    ({"ASCEND_SHIM_FP8": "int8", "ASCEND_SHIM_DISABLE": "*"}, True, "ASCEND_SHIM_DISABLE naming kitchen_int8 and int_mm"),
    ({"ASCEND_SHIM_FP8": "int8", "ASCEND_SHIM_INT8": "upstream"}, False,
     "ASCEND_SHIM_INT8=upstream on a comfy-kitchen without its own ascend backend"),
    ({"ASCEND_SHIM_FP8": "int8", "ASCEND_SHIM_INT8": "upstream"}, True, None),  # upstream's ascend serves
    ({"ASCEND_SHIM_FP8": "int8", "ASCEND_SHIM_INT8": "upstream", "ASCEND_SHIM_DISABLE": "kitchen_int8"}, False,
     None),  # eager reaches the shim's _int_mm kernel
    ({"ASCEND_SHIM_FP8": "int8", "ASCEND_SHIM_DISABLE": "int_mm"}, False, None),
    ({"ASCEND_SHIM_FP8": "int8", "ASCEND_SHIM_DISABLE": "kitchen_int8"}, False, None),
    ({"ASCEND_SHIM_FP8": "bf16", "ASCEND_SHIM_INT8": "off"}, False, None),  # bf16 asked: nothing to name
    ({"ASCEND_SHIM_INT8": "off"}, False, None),
])
def test_configured_gap(env, upstream, gap):
    assert fp8_effective.configured_gap(_config.Config(env), upstream) == gap


def test_status_line_says_what_fp8_weights_become():
    assert reports.fp8_line(None) == []
    assert reports.fp8_line({"setting": "int8", "form": "int8", "why": ""}) == ["fp8 weights: int8"]
    why = "ASCEND_SHIM_FP8=int8, but ASCEND_SHIM_INT8=off"
    assert reports.fp8_line({"setting": "int8", "form": "bf16", "why": why}) == ["fp8 weights: bf16 (%s)" % why]
    assert reports.fp8_line({"setting": "off", "form": None, "why": "ASCEND_SHIM_FP8=off"}) == [
        "fp8 weights: kept as float8 (ASCEND_SHIM_FP8=off)"]


@pytest.mark.parametrize("env, named", [
    ({"ASCEND_SHIM_INT8": "off"}, False),
    ({"ASCEND_SHIM_INT8": "off", "ASCEND_SHIM_DISABLE": "int_mm"}, True),
    ({"ASCEND_SHIM_DISABLE": "kitchen_int8,int_mm"}, True),
    ({"ASCEND_SHIM_DISABLE": "int_mm"}, False),
    ({}, False),
])
def test_doctor_names_fp8_int8_without_an_npu_int8_path(bed_python, tmp_path, env, named):
    proc = harness.run([str(bed_python), "-m", "ascend_shim", "doctor", "--json"],
                       harness.bed_env("ascend-cu130", kitchen="0.2.27", ASCEND_SHIM_FP8="int8", **env),
                       tmp_path, timeout=300)
    report = json.loads(proc.stdout)
    found = [f for f in report["findings"] if NAMED in f["what"]]
    assert len(found) == (1 if named else 0), report["findings"]
    if named:
        assert found[0]["severity"] == "warning" and "ASCEND_SHIM_FP8=bf16" in found[0]["fix"]


def test_doctor_says_nothing_about_fp8_where_no_npu_is(bed_python, tmp_path):
    proc = harness.run([str(bed_python), "-m", "ascend_shim", "doctor", "--json"],
                       harness.bed_env("cpu", ASCEND_SHIM_FP8="int8", ASCEND_SHIM_INT8="off"), tmp_path, timeout=300)
    assert not [f for f in json.loads(proc.stdout)["findings"] if NAMED in f["what"]]


@pytest.mark.parametrize("env, functions", [
    ({"ASCEND_SHIM_DISABLE": "kitchen_int8,int_mm"}, "int8_linear, w4a8_int8_linear"),
    ({"ASCEND_SHIM_INT8": "off", "ASCEND_SHIM_DISABLE": "int_mm"}, "int8_linear, w4a8_int8_linear"),
    ({"ASCEND_SHIM_INT8": "upstream", "ASCEND_SHIM_DISABLE": "int_mm"}, "w4a8_int8_linear"),
    ({"ASCEND_SHIM_INT8": "off"}, None),  # eager reaches the shim's _int_mm kernel
    ({"ASCEND_SHIM_DISABLE": "int_mm"}, None),  # the shim's backends serve both
])
def test_doctor_names_settings_that_leave_int8_on_the_cpu(bed_python, tmp_path, env, functions):
    proc = harness.run([str(bed_python), "-m", "ascend_shim", "doctor", "--json"],
                       harness.bed_env("ascend-cu130", kitchen="0.2.27", **env), tmp_path, timeout=300)
    found = [f for f in json.loads(proc.stdout)["findings"] if "torch_npu's CPU fallback" in f["what"]]
    if functions is None:
        assert found == []
    else:
        assert len(found) == 1 and ("no NPU backend serves %s:" % functions) in found[0]["what"], found
        assert found[0]["severity"] == "warning"
