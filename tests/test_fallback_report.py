"""CPU-fallback report: torch_npu's fallback warnings, in status and after each prompt."""

import harness

SCENARIO = """
import json, logging, io, sys, warnings
stream = io.StringIO()
logging.basicConfig(level=logging.INFO, stream=stream, format="%(name)s %(levelname)s %(message)s")
sys.argv = ["main.py"]
import comfy.options
comfy.options.enable_args_parsing()
import comfy.utils, comfy.quant_ops, comfy.model_management, comfy.ops
import execution, torch
import ascend_shim

layer = comfy.ops.make_int8_linear(torch.randint(-127, 128, (64, 128), dtype=torch.int8),
                                   torch.tensor(0.01), device=torch.device("npu", 0))
x = torch.randn(4, 128, dtype=torch.bfloat16).to("npu")
executor = execution.PromptExecutor()
executor.execute(lambda: layer(x), "prompt-1")
first = [l for l in stream.getvalue().splitlines() if "ran on the CPU" in l]
executor.execute(lambda: layer(x), "prompt-2")
second = [l for l in stream.getvalue().splitlines() if "ran on the CPU" in l]
print(json.dumps({"fallbacks": sorted(ascend_shim.status()["cpu_fallbacks"]),
                  "first": first, "second": second,
                  "states": {r["name"]: r["state"] for r in ascend_shim.status()["patches"]}}))
"""


def test_fallbacks_are_reported_once_after_a_prompt(run_bed):
    result = harness.last_json(run_bed(SCENARIO, comfy="v0_29", kitchen="0.2.26", ASCEND_SHIM_INT8="off"))
    assert result["fallbacks"] == ["aten::_int_mm"]
    assert len(result["first"]) == 1 and "aten::_int_mm" in result["first"][0]
    assert result["first"][0].startswith("ascend_shim WARNING")
    assert result["second"] == result["first"]  # not repeated for an op already reported
    assert result["states"]["cpu_fallbacks"] == "applied"
    assert result["states"]["prompt_report"] == "applied"


def test_nothing_falls_back_with_the_shim_active(run_bed):
    result = harness.last_json(run_bed(SCENARIO, comfy="v0_29", kitchen="0.2.26"))
    assert result["fallbacks"] == []
    assert result["first"] == [] and result["second"] == []


def test_report_parses_the_warning_text():
    from ascend_shim import fallback_report

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
    fallback_report.reset()
