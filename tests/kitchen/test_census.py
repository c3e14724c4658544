"""Census of comfy-kitchen's INT8-family functions on NPU tensors, for every release the suite downloads.

``census_cases.py`` calls each public INT8/INT4 function of one release on
the CPU (the reference) and on the simulated NPU with the shim installed.
Every function must stay on the device (zero CPU fallbacks) and agree with
the CPU. Where the bed cannot build inputs, or kitchen has no implementation
off CUDA, the function is listed below with the reason: a new function the
census does not know fails the test instead of being skipped.
"""

import pytest

import harness

CASES = harness.TESTS / "kitchen" / "census_cases.py"

# function -> why the census cannot check its numbers on the NPU
NOT_BUILT = {
    "w4a8_int8_linear(mma_packed=True)": "packed W4A8 records are built only by kitchen's CUDA backend",
    "int8_attention_from_prequantized": "its input comes from prequantize_int8_attention, CUDA-only",
}
# kitchen's own CUDA-only functions: they refuse CPU tensors as well
CUDA_ONLY = {"int8_attention", "prequantize_int8_attention"}


@pytest.fixture(scope="session")
def census(bed_python, tmp_path_factory):
    cache = {}

    def run(version):
        if version not in cache:
            cwd = tmp_path_factory.mktemp("census")
            proc = harness.run([str(bed_python), str(CASES)],
                               harness.bed_env("ascend-cu130", kitchen=version), cwd, timeout=600)
            assert proc.returncode == 0, proc.stderr[-4000:]
            cache[version] = harness.last_json(proc)["functions"]
        return cache[version]

    return run


@pytest.mark.parametrize("version", harness.KITCHEN_VERSIONS)
def test_every_int8_function_stays_on_the_npu(census, version):
    functions = census(version)
    assert {"int8_linear", "mm_int8", "quantize_int8_rowwise", "dequantize_int8_simple"} <= set(functions)
    for name, result in functions.items():
        if result["status"] == "not_built":
            assert name in NOT_BUILT, (name, result["reason"])
            continue
        assert result["cpu_fallbacks"] == [], (name, result)
        if result["status"] == "refused_on_cpu_too":
            assert name in CUDA_ONLY, (name, result)
            continue
        assert result["status"] == "ok", (name, result)
        assert result["agree"] is True, (name, result)


@pytest.mark.parametrize("version", [v for v in harness.KITCHEN_VERSIONS if v >= "0.2.27"])
def test_w4a8_is_in_the_census(census, version):
    functions = census(version)
    for name in ("w4a8_int8_linear", "quantize_w4a8_int8_weight", "dequantize_w4a8_int8_weight",
                 "convrot_w4a4_linear"):
        assert functions[name]["status"] == "ok" and functions[name]["agree"], (name, functions[name])
