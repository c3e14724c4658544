"""fp8 checkpoints through ComfyUI's own loaders, on the simulated machines.

``fp8_cases.py`` runs every fp8 entry point of the ComfyUI 0.30 contract
(checkpoint, diffusion model and text-encoder loaders; the mixed-precision
Linear; LoRA on an fp8 layer; the Load Diffusion Model node's fp8
weight_dtype; the ``--fp8_*`` flags) on the newest real ComfyUI (v0.33.0) in a fresh
interpreter of the bed venv, against ComfyUI's own model classes run in
float32 on the weights the fp8 files stand for. The
simulated 910B refuses float8 npu tensors as torch_npu does, so every case
fails there without the fp8 patches and runs with them; an Ascend 950, a
``--cpu`` run and a CPU machine keep their fp8 as ComfyUI has it.
"""

import pytest

import harness

CASES_SCRIPT = harness.TESTS / "patches" / "fp8_cases.py"
COMFYUI = harness.COMFYUI_NEWEST
KITCHEN = harness.COMFYUI_NEWEST_KITCHEN  # the comfy-kitchen it pins
FP8_PATCHES = ("fp8_dtypes", "fp8_state_dict", "fp8_layer", "fp8_loader_options")
FLAGS = ("--fp8_e4m3fn-unet", "--fp8_e4m3fn-text-enc")
# every model is "too big for the card": unet_dtype keeps an fp8 file's dtype (as for a 14B model)
TOO_BIG = ("--reserve-vram", "64")
NO_FLOAT8 = "RuntimeError: Float8_e4m3fn has not been supported"
FP8_FILE_CASES = ("checkpoint_scaled_fp8", "diffusion_comfy_quant", "lora", "mixed_linear", "mixed_linear_direct")
INT8_CASES = FP8_FILE_CASES + ("diffusion_unscaled",)  # what the ASCEND_SHIM_FP8=int8 tests read
FLAG_CASES = ("flags", "weight_dtype_option")


@pytest.fixture(scope="session")
def fp8_run(bed_python, tmp_path_factory):
    cache = {}

    def run(machine="ascend-cu130", flags=(), kitchen=KITCHEN, cases=(), **env):
        """One fp8_cases.py run; ``cases`` picks the cases it runs (all by default): the
        CLIP-L text encoder alone takes ~12 s a run, so runs that do not read it leave it out."""
        if cases:
            env["FP8_CASES"] = ",".join(cases)
        key = (machine, tuple(flags), kitchen, tuple(sorted(env.items())))
        if key not in cache:
            cwd = tmp_path_factory.mktemp("fp8")
            proc = harness.run([str(bed_python), str(CASES_SCRIPT), str(harness.comfyui_dir(COMFYUI)), "--", *flags],
                               harness.bed_env(machine, kitchen=kitchen, **env), cwd, timeout=300)
            cache[key] = harness.last_json(proc)
        return cache[key]

    return run


def passed(result, name):
    case = result["cases"][name]
    assert case.get("ok"), "%s: %s\n%s" % (name, case.get("error"), case.get("trace", ""))
    return case


def float8_on(case, device):
    groups = [case[k] for k in ("weights", "text_weights", "scaled_weights", "unscaled_weights") if k in case]
    return sorted(k for g in groups for k in g if k.startswith("float8") and k.endswith("@" + device))


def cosines(case):
    return {k: v for k, v in case.items() if k == "cos" or k.endswith("_cos") and k != "cos_without_lora"}


def test_every_fp8_entry_point_fails_on_the_910b_without_the_fp8_patches(fp8_run):
    result = fp8_run(flags=TOO_BIG, ASCEND_SHIM_FP8="off")
    assert {r["state"] for r in result["status"].values()} == {"skipped"}
    assert all(r["reason"] == "ASCEND_SHIM_FP8=off" for r in result["status"].values())
    for name in FP8_FILE_CASES + ("diffusion_unscaled", "weight_dtype_option", "w4a8_layer"):
        assert result["cases"][name].get("error") == NO_FLOAT8, name
    # ComfyUI's load_clip casts an fp8 text encoder to 16 bits on the host: no error on the 910B,
    # but the scaled file loses its scale there, a wrong number the patches prevent
    text = result["cases"]["text_encoder"]
    assert text.get("error") == NO_FLOAT8 or text["scaled_cos"] < 0.9, text


def test_every_fp8_entry_point_runs_in_bf16_on_the_910b(fp8_run):
    result = fp8_run(flags=TOO_BIG)
    assert {n: r["state"] for n, r in result["status"].items()} == {n: "applied" for n in FP8_PATCHES}
    for name in result["cases"]:
        case = passed(result, name)
        assert float8_on(case, "npu") == [], name
        assert all(v >= 0.9999 for v in cosines(case).values()), (name, cosines(case))
        if name != "w4a8_layer":  # fp8 layers compute in bf16; W4A8 stays on the NPU INT8 path
            assert case.get("quant_matmul", 0) == 0, name
    # the text encoders were not shifted to the CPU (the tiny Wan checkpoint carries none: its
    # real encoder is UMT5-XXL; load_clip's CLIP-L stands for both)
    assert result["cases"]["text_encoder"]["scaled_device"] == "npu:0"
    assert result["cases"]["text_encoder"]["unscaled_device"] == "npu:0"


def test_w4a8_group_scales_reach_the_npu_as_float32(fp8_run):
    case = passed(fp8_run(flags=TOO_BIG), "w4a8_layer")
    assert case["s_rel"] == "float32@npu" and case["weights"] == {"int8@npu": 1}
    assert case["quant_matmul"] > 0 and case["cos"] >= 0.9999


def test_bf16_weights_take_two_bytes_per_fp8_byte(fp8_run):
    case = passed(fp8_run(flags=TOO_BIG), "diffusion_comfy_quant")
    assert case["weight_bytes"] == 2 * case["weight_elements"]


def test_lora_on_a_decoded_fp8_layer_is_applied(fp8_run):
    for result in (fp8_run(flags=TOO_BIG), fp8_run(flags=TOO_BIG, cases=INT8_CASES, ASCEND_SHIM_FP8="int8")):
        case = passed(result, "lora")
        assert case["patched"] == ["diffusion_model.head.head.weight"]
        assert case["cos"] >= 0.999 and case["cos_without_lora"] < 0.995, case


def test_int8_form_serves_fp8_layers_through_the_npu_int8_path(fp8_run):
    result = fp8_run(flags=TOO_BIG, cases=INT8_CASES, ASCEND_SHIM_FP8="int8")
    for name in FP8_FILE_CASES:
        case = passed(result, name)
        # "too big for the card": ComfyUI keeps some weights on the host and streams them per
        # layer, so int8 storage may sit on either side; the matmuls run on the NPU quant op
        assert float8_on(case, "npu") == [] and any(k.startswith("int8@") for k in case["weights"]), name
        assert case["quant_matmul"] > 0, name
        assert case["cos"] >= 0.999, (name, case["cos"])
    memory = result["cases"]["diffusion_comfy_quant"]
    assert memory["weight_bytes"] < 1.05 * memory["weight_elements"]  # fp8's memory, plus one scale per row
    unscaled = passed(result, "diffusion_unscaled")  # no scale to requantize from: exact bf16
    assert float8_on(unscaled, "npu") == [] and unscaled["cos"] >= 0.9999


def test_fp8_flags_and_load_options_hold_16_bit_weights_on_the_910b(fp8_run):
    broken = fp8_run(flags=FLAGS, cases=FLAG_CASES, ASCEND_SHIM_FP8="off")
    assert broken["cases"]["flags"].get("error") == NO_FLOAT8
    result = fp8_run(flags=FLAGS, cases=FLAG_CASES)
    case = passed(result, "flags")
    assert float8_on(case, "npu") == [] and case["cos"] >= 0.9999 and case["text_cos"] >= 0.9999
    assert case["text_encoder_dtype"] == "torch.bfloat16" and case["text_device"] == "npu:0"
    assert float8_on(passed(result, "weight_dtype_option"), "npu") == []


def test_an_npu_that_holds_float8_keeps_fp8_as_comfyui_has_it(fp8_run):
    cases = FP8_FILE_CASES + ("w4a8_layer",)
    result = fp8_run(machine="ascend-cpu", TESTBED_NPU_NAME="Ascend950PR", cases=cases)
    untouched = fp8_run(machine="ascend-cpu", TESTBED_NPU_NAME="Ascend950PR", cases=cases, ASCEND_SHIM="0")
    assert all(r["state"] == "skipped" and "holds float8" in r["reason"] for r in result["status"].values())
    for name in FP8_FILE_CASES:  # what ComfyUI itself does with fp8 there, unchanged
        assert float8_on(passed(result, name), "npu") == float8_on(passed(untouched, name), "npu"), name
    assert [name for name in FP8_FILE_CASES if float8_on(result["cases"][name], "npu")]
    assert passed(result, "w4a8_layer")["s_rel"] == "float8_e4m3fn@npu"


@pytest.mark.parametrize("machine, flags", [("ascend-cu130", ("--cpu",)), ("cpu", ("--cpu",))])
def test_a_cpu_run_keeps_fp8_on_the_host(fp8_run, machine, flags):
    result = fp8_run(machine=machine, flags=flags, cases=FP8_FILE_CASES)
    if machine == "cpu":  # no torch_npu: the shim left the import path before deciding anything
        assert result["status"] is None
    else:
        assert all(r["state"] == "skipped" for r in result["status"].values())
    for name in FP8_FILE_CASES:
        assert float8_on(passed(result, name), "cpu"), name


REAL_CASES = ("mixed_linear", "mixed_linear_direct", "w4a8_layer")
REAL_KITCHEN = {harness.COMFYUI_NEWEST: harness.COMFYUI_NEWEST_KITCHEN, harness.COMFYUI_USER: harness.COMFYUI_USER_KITCHEN}  # the newest release and the users'


@pytest.mark.parametrize("comfyui", list(REAL_KITCHEN))
def test_real_comfyui_mixed_precision(bed_python, tmp_path, comfyui):
    """A real ComfyUI's own convert_old_quants and mixed-precision Linear (no comfy.sd: it needs torchvision)."""
    comfy_dir = str(harness.comfyui_dir(comfyui))
    runs = {}
    for label, env in (("off", {"ASCEND_SHIM_FP8": "off"}), ("on", {}), ("int8", {"ASCEND_SHIM_FP8": "int8"})):
        proc = harness.run([str(bed_python), str(CASES_SCRIPT), comfy_dir],
                           harness.bed_env("ascend-cu130", kitchen=REAL_KITCHEN[comfyui],
                                           FP8_CASES=",".join(REAL_CASES), **env),
                           tmp_path, timeout=600)
        runs[label] = harness.last_json(proc)
    for name in REAL_CASES:
        if runs["on"]["cases"][name].get("skipped") and comfyui != harness.COMFYUI_NEWEST:
            continue  # W4A8 needs comfy-kitchen 0.2.27+; v0.30.0 pins 0.2.26
        assert runs["off"]["cases"][name].get("error") == NO_FLOAT8, name
        case = passed(runs["on"], name)
        assert float8_on(case, "npu") == [] and case["cos"] >= 0.9999, (name, case)
    for name in ("mixed_linear", "mixed_linear_direct"):  # int8 form: requantized, served by the NPU INT8 path
        case = passed(runs["int8"], name)
        assert case["weights"] == {"int8@npu": 2 if name == "mixed_linear" else 1}, (name, case)
        assert case["quant_matmul"] > 0 and case["cos"] >= 0.999, (name, case)
