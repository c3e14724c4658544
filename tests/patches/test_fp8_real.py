"""fp8 weights in real ComfyUI releases on the simulated 910B: every comfy_quant layer
class, ``ASCEND_SHIM_FP8=int8`` without an NPU INT8 path, and the policy matrix.

Each script runs in a fresh interpreter of the bed venv with a real ComfyUI
tree (``harness.comfyui_dir``) and the comfy-kitchen release it pins (or the
nearest one the suite downloads); the bed counts every CPU fallback.
"""

import pytest

import harness

WALK = harness.TESTS / "patches" / "fp8_layer_walk.py"
MATRIX = harness.TESTS / "patches" / "fp8_matrix.py"
NO_FLOAT8 = "RuntimeError: Float8_e4m3fn has not been supported"
# ComfyUI releases with mixed_precision_ops, each with the comfy-kitchen it pins or the nearest downloaded one
WALKED = {harness.COMFYUI_NEWEST: harness.COMFYUI_NEWEST_KITCHEN, harness.COMFYUI_USER: harness.COMFYUI_USER_KITCHEN, "0.27.0": "0.2.19"}
FP8_LAYERS, INT8_LAYERS = ("fp8", "fp8_raw"), ("int8", "w4a8")
BOTH_OFF = "kitchen_int8,int_mm"


def run_script(bed_python, tmp_path, script, comfyui, kitchen, *args, **env):
    proc = harness.run([str(bed_python), str(script), str(harness.comfyui_dir(comfyui)), *args],
                       harness.bed_env("ascend-cu130", kitchen=kitchen, **env), tmp_path, timeout=600)
    return harness.last_json(proc), proc.stderr


@pytest.mark.parametrize("comfyui", list(WALKED))
def test_every_comfy_quant_layer_class_keeps_float8_off_the_910b(bed_python, tmp_path, comfyui):
    result, _ = run_script(bed_python, tmp_path, WALK, comfyui, WALKED[comfyui])
    assert "fp8_layer" in result["fp8_patches"]
    classes = set(result["patched"])
    # without the shim's fp8 patches every class the ops define takes a comfy_quant float8 weight to the NPU
    assert {n for n, r in result["unpatched"].items() if r.get("error") == NO_FLOAT8} == classes
    assert {"Linear", "MoEExperts"} <= classes  # the walk is not vacuous
    for name, case in result["patched"].items():
        assert "error" not in case, (name, case)
        assert case["float8_on_device"] == [] and case["cpu_fallbacks"] == {}, (name, case)
        assert case["cos"] >= 0.9999, (name, case)


def test_int8_form_requantizes_linear_and_decodes_lookup_tables_and_experts(bed_python, tmp_path):
    result, _ = run_script(bed_python, tmp_path, WALK, harness.COMFYUI_NEWEST, WALKED[harness.COMFYUI_NEWEST], ASCEND_SHIM_FP8="int8")
    cases = result["patched"]
    assert cases["Linear"]["weight_dtype"] == "torch.int8" and cases["Linear"]["cos"] >= 0.999
    assert cases["MoEExperts"]["weight_dtype"] == "torch.bfloat16"  # 3-D expert banks: bf16
    assert cases["Embedding"]["weight_dtype"] != "torch.int8"  # ComfyUI 0.27 loads no int8 table
    for name, case in cases.items():
        assert case["float8_on_device"] == [] and case["cpu_fallbacks"] == {}, (name, case)


@pytest.mark.parametrize("env, why", [
    ({"ASCEND_SHIM_INT8": "off", "ASCEND_SHIM_DISABLE": "int_mm"}, "ASCEND_SHIM_INT8=off"),
    ({"ASCEND_SHIM_DISABLE": BOTH_OFF}, "ASCEND_SHIM_DISABLE names kitchen_int8 and int_mm"),
])
def test_fp8_int8_without_an_npu_int8_path_is_bf16_said_once(bed_python, tmp_path, env, why):
    result, stderr = run_script(bed_python, tmp_path, MATRIX, harness.COMFYUI_NEWEST, harness.COMFYUI_NEWEST_KITCHEN, "--as-started",
                                ASCEND_SHIM_FP8="int8", **env)
    said = "ascend_shim: ASCEND_SHIM_FP8=int8, but %s: fp8 weights are decoded to bf16 instead" % why
    assert stderr.count(said) == 1, stderr
    for combo in result["combos"]:  # the same layers loaded twice
        assert combo["fp8_report"] == {"setting": "int8", "form": "bf16", "why": "ASCEND_SHIM_FP8=int8, but " + why}
        assert combo["patches"]["fp8_state_dict"] == ["applied", "fp8 -> bf16 (ASCEND_SHIM_FP8=int8, but %s)" % why]
        for name in FP8_LAYERS:
            layer = combo["layers"][name]
            assert layer["weights"] == {"bfloat16@npu": 1} and layer["cpu_fallbacks"] == {}, (name, layer)


def test_fp8_int8_keeps_int8_where_the_npu_int8_path_is_registered(bed_python, tmp_path):
    result, stderr = run_script(bed_python, tmp_path, MATRIX, harness.COMFYUI_NEWEST, harness.COMFYUI_NEWEST_KITCHEN, "--as-started",
                                ASCEND_SHIM_FP8="int8")
    assert "ascend_shim:" not in stderr, stderr
    for combo in result["combos"]:
        assert combo["fp8_report"] == {"setting": "int8", "form": "int8", "why": ""}
        assert combo["patches"]["fp8_state_dict"] == ["applied", "fp8 -> int8"]
        for name in FP8_LAYERS:
            layer = combo["layers"][name]
            assert layer["weights"] == {"int8@npu": 1} and layer["dynamic_quant"] == 1, (name, layer)
            assert layer["cpu_fallbacks"] == {} and layer["cos"] >= 0.999, (name, layer)


@pytest.fixture(scope="module")
def matrix(bed_python, tmp_path_factory):
    """ASCEND_SHIM_INT8 x ASCEND_SHIM_FP8 x ASCEND_SHIM_DISABLE in one interpreter (64 combinations)."""
    result, _ = run_script(bed_python, tmp_path_factory.mktemp("matrix"), MATRIX, harness.COMFYUI_NEWEST, harness.COMFYUI_NEWEST_KITCHEN)
    assert len(result["combos"]) == 64
    return result["combos"]


def int8_path_expected(combo):
    """An NPU INT8 path: the shim's kitchen backend (not under upstream without upstream's own
    backend, which 0.2.31 lacks), or comfy-kitchen's eager reaching the shim's _int_mm kernel."""
    if (combo["int8"] == "off" and "int_mm" in combo["disable"]) or combo["disable"] == BOTH_OFF:
        return False
    return combo["int8"] != "upstream" or "kitchen_int8" in combo["disable"]


def every_int8_fix_off(combo, layer):
    """The combinations where the user switched off every shim path that keeps ``layer`` on the NPU."""
    if (combo["int8"] == "off" and "int_mm" in combo["disable"]) or combo["disable"] == BOTH_OFF:
        return True
    # upstream registers only the int8_linear fallback: W4A8 goes to eager, whose _int_mm needs the int_mm patch
    return layer == "w4a8" and combo["int8"] == "upstream" and combo["disable"] == "int_mm"


def test_no_policy_combination_puts_fp8_layers_on_the_cpu(matrix):
    for combo in matrix:
        label = (combo["int8"], combo["fp8"], combo["disable"])
        for name in FP8_LAYERS:
            layer = combo["layers"][name]
            assert layer["cpu_fallbacks"] == {}, (label, name, layer)
            if combo["fp8"] == "off":  # fp8 left as ComfyUI has it: the 910B refuses it
                assert layer["error"] == NO_FLOAT8, (label, name, layer)
                continue
            assert "error" not in layer and layer["cos"] >= 0.999, (label, name, layer)
            assert not any(k.startswith("float8") for k in layer["weights"]), (label, name, layer)
            form = "int8" if combo["fp8"] == "int8" and int8_path_expected(combo) else "bf16"
            assert combo["fp8_report"]["form"] == form, (label, combo["fp8_report"])
            assert layer["weights"] == {"%s@npu" % ("int8" if form == "int8" else "bfloat16"): 1}, (label, name, layer)
            kitchen_serves = "kitchen_int8" not in combo["disable"] and combo["int8"] != "off"
            assert layer["dynamic_quant"] == (1 if form == "int8" and kitchen_serves else 0), (label, name, layer)


def test_int8_and_w4a8_layers_stay_on_the_npu_while_an_int8_fix_is_on(matrix):
    checked = 0
    for combo in matrix:
        for name in INT8_LAYERS:
            layer = combo["layers"][name]
            if every_int8_fix_off(combo, name) or (name == "w4a8" and combo["fp8"] == "off"):
                continue  # (an fp8-off W4A8 layer keeps its float8 group scales: refused, not a fallback)
            assert "error" not in layer and layer["cpu_fallbacks"] == {}, (combo["int8"], combo["fp8"],
                                                                             combo["disable"], name, layer)
            assert layer["cos"] >= 0.99
            checked += 1
    assert checked == 74  # 44 combinations x 2 layers, less W4A8 under fp8 off (11) and upstream+int_mm (3)


LAYER_FUNCTION = {"int8": "int8_linear", "w4a8": "w4a8_int8_linear"}


def test_int8_layers_reach_the_cpu_only_where_the_user_switched_off_every_npu_path(matrix):
    """The only CPU cells are those where ASCEND_SHIM_DISABLE names int_mm and no NPU backend
    serves the function; exactly those are named by int8_gaps (and said at startup)."""
    for combo in matrix:
        label = (combo["int8"], combo["fp8"], combo["disable"])
        for name in INT8_LAYERS:
            layer = combo["layers"][name]
            if "error" in layer:  # an fp8-off W4A8 layer: refused as float8, not a fallback
                continue
            named = LAYER_FUNCTION[name] in combo["cpu_bound"]
            assert named == every_int8_fix_off(combo, name), (label, name, combo["cpu_bound"])
            assert bool(layer["cpu_fallbacks"]) == named, (label, name, layer)


def test_settings_that_leave_int8_on_the_cpu_are_said_once_at_startup(bed_python, tmp_path):
    _, stderr = run_script(bed_python, tmp_path, MATRIX, harness.COMFYUI_NEWEST, harness.COMFYUI_NEWEST_KITCHEN, "--as-started",
                           ASCEND_SHIM_DISABLE=BOTH_OFF)
    said = ("ascend_shim: warning: nothing keeps comfy-kitchen's int8_linear, w4a8_int8_linear on the NPU "
            "(ASCEND_SHIM_DISABLE names int_mm and no NPU backend serves them)")
    assert stderr.count(said) == 1, stderr
