"""W4A8 on the NPU quant ops (ascend_shim/kitchen/w4a8.py), against kitchen's eager on the CPU.

Each (release, suite) runs ``w4a8_cases.py`` once in a fresh interpreter of a
venv with the shim wheel installed, on the simulated Ascend machine. The
first and the newest release with W4A8 in the suite's downloads are checked.
"""

import pytest

import harness

VERSIONS = tuple(v for v in ("0.2.27", "0.2.40") if v in harness.KITCHEN_VERSIONS)
CASES = harness.TESTS / "kitchen" / "w4a8_cases.py"
COSINE = 0.999


@pytest.fixture(scope="session")
def w4a8_run(bed_python, tmp_path_factory):
    cache = {}

    def run(version, suite):
        key = (version, suite)
        if key not in cache:
            cwd = tmp_path_factory.mktemp("w4a8")
            proc = harness.run([str(bed_python), str(CASES), suite],
                               harness.bed_env("ascend-cu130", kitchen=version), cwd, timeout=600)
            assert proc.returncode == 0, proc.stderr[-4000:]
            cache[key] = harness.last_json(proc)
        return cache[key]

    return run


@pytest.mark.parametrize("version", VERSIONS)
def test_w4a8_runs_on_the_npu_quant_ops(w4a8_run, version):
    result = w4a8_run(version, "shapes")
    assert len(result["cases"]) == 7
    for case in result["cases"]:
        assert case["device"] == "npu:0" and case["shape"] == case["want_shape"], case
        assert case["cpu_fallbacks"] == [], case
        # one dynamic quant + one quant matmul per call, served by the shim
        assert (case["dynamic_quant"], case["quant_matmul"]) == (1, 1), case
        assert case["served_npu_quant"] == 1, case
        assert case["cos"] >= COSINE, case
    assert result["report"]["float_path"] == 0


@pytest.mark.parametrize("version", VERSIONS)
def test_declined_calls_stay_on_the_device_and_match_eager(w4a8_run, version):
    result = w4a8_run(version, "declined")
    names = [c["name"] for c in result["cases"]]
    assert names[:2] == ["correction", "fp32 x"]
    if version >= "0.2.40":
        assert "6-bit" in names
    for case in result["cases"]:
        assert case["device"] == "npu:0" and case["cpu_fallbacks"] == [], case
        assert case["served_npu_quant"] == 0 and case["quant_matmul"] == 0, case
        assert case["cos"] >= 0.9999, case  # eager itself, on the device
    declined = {c["name"]: c["declined"] for c in result["cases"]}
    assert declined["correction"] == ["correction"]
    if "6-bit" in declined:
        assert declined["6-bit"] == ["qdata"]


@pytest.mark.parametrize("version", VERSIONS)
def test_bad_input_gets_eagers_error(w4a8_run, version):
    errors = w4a8_run(version, "declined")["errors"]
    assert errors["cpu"] == "ValueError"
    assert errors["npu"] == errors["cpu"]


@pytest.mark.parametrize("version", VERSIONS)
def test_future_options_are_declined_not_refused(w4a8_run, version):
    future = w4a8_run(version, "declined")["future"]
    assert future == {"plain_is_shim": True, "future_is_eager": True, "neutral_is_shim": True}


COMFY_NEWEST = """
    import json, sys, warnings
    warnings.simplefilter("ignore")
    import torch
    import comfy.model_management as mm
    import comfy.ops
    import comfy.quant_ops
    import comfy_kitchen as ck
    from testbed import npu_device
    from ascend_shim.kitchen import w4a8

    def marker(conf):
        return torch.tensor(list(json.dumps(conf).encode()), dtype=torch.uint8)

    def cosine(a, b):
        return float(torch.nn.functional.cosine_similarity(a.float().flatten(), b.float().flatten(), dim=0))

    device = mm.get_torch_device()
    config = type("ModelConfig", (), {"quant_config": {"mixed_ops": True}})()
    ops = comfy.ops.pick_operations(torch.bfloat16, torch.bfloat16, load_device=device, model_config=config)
    torch.manual_seed(0)
    n, k = 256, 512
    qdata, s_rel, s_channel, _correction, codebook = ck.quantize_w4a8_int8_weight(torch.randn(n, k) * 0.02)
    bias = torch.randn(n, dtype=torch.bfloat16)
    layer = ops.Linear(k, n, bias=True, device=device)
    # as files hold it (float8_e4m3fn, or its bytes as uint8), or already float32
    stored = {"fp32": s_rel.float(), "fp8": s_rel, "uint8": s_rel.view(torch.uint8)}[sys.argv[1]]
    layer.load_state_dict({"weight": qdata, "weight_s_rel": stored, "weight_s_channel": s_channel,
                           "weight_codebook": codebook, "bias": bias,
                           "comfy_quant": marker({"format": "asym_w4a8_int8", "group_size": 16,
                                                  "convrot_groupsize": 256})})
    x = torch.randn(2, 7, k, dtype=torch.bfloat16)
    want = ck.w4a8_int8_linear(x, qdata, s_rel, s_channel, codebook=codebook, bias=bias)
    npu_device.reset_cpu_fallbacks()
    got = layer(x.to(device))
    print(json.dumps({
        "device": str(device), "weight_device": str(layer.weight.device),
        # the formats pick_operations computed as not native on this device (ComfyUI keeps them on the class)
        "disabled": sorted(ops._disabled),
        "int8_algos": {name: [algo["comfy_tensor_layout"], algo["quantize_input"]]
                       for name, algo in comfy.quant_ops.QUANT_ALGOS.items() if algo["storage_t"] == torch.int8},
        "out_device": str(got.device), "shape": list(got.shape), "cos": cosine(got.cpu(), want),
        "cpu_fallbacks": sorted(npu_device.cpu_fallbacks()), "w4a8": w4a8.report()}))
"""


@pytest.mark.parametrize("s_rel", ["fp32", "fp8", "uint8"])
def test_comfy_v0_30_runs_a_w4a8_layer_on_the_npu(run_bed, s_rel):
    """fp8/uint8 group scales need the fp8 decode as well (no float8 on a 910B): both fixes at once.
    The newest real ComfyUI (v0.33.0; W4A8 came after the users' v0.30.0) and the
    comfy-kitchen it pins."""
    proc = run_bed(COMFY_NEWEST, comfy=harness.comfyui_dir(harness.COMFYUI_NEWEST), kitchen=harness.COMFYUI_NEWEST_KITCHEN, argv=[s_rel])
    assert proc.returncode == 0, proc.stderr[-4000:]
    out = harness.last_json(proc)
    assert out["device"] == "npu:0" and out["weight_device"] == "npu:0"
    assert not {"int8_tensorwise", "convrot_w4a4", "asym_w4a8_int8"} & set(out["disabled"])
    assert out["int8_algos"] == {"int8_tensorwise": ["TensorWiseINT8Layout", False],
                                 "convrot_w4a4": ["TensorCoreConvRotW4A4Layout", False],
                                 "asym_w4a8_int8": ["AsymW4A8Int8Layout", False]}
    assert out["out_device"] == "npu:0" and out["shape"] == [2, 7, 256]
    assert out["cpu_fallbacks"] == []
    assert out["w4a8"]["npu_quant"] == 1 and out["w4a8"]["float_path"] == 0, out
    assert out["cos"] >= COSINE, out
