"""A real sampling workflow, end to end, on the simulated 910B (issue 20, item 3).

Real ComfyUI 0.30.0 and comfy-kitchen 0.2.27; a tiny random Flux checkpoint
built by ``tiny_models.py`` in bf16, int8_tensorwise, asym_w4a8_int8 and
float8_e4m3fn variants, loaded by ``comfy.sd.load_diffusion_model`` and
sampled by ``comfy.sample.sample`` (``sample_cases.py``). Four legs, one
fresh interpreter each:

  cpu      plain CPU, no shim (ASCEND_SHIM=0, --cpu): the reference, in fp32
  shim     ascend-cu130 with the shim: what the user runs
  lowvram  ascend-cu130 with the shim, --lowvram with all VRAM reserved: weights stream
  noshim   ascend-cu130, ASCEND_SHIM=0: what users saw before the shim

Cosines compare the first step's velocity (the model's output for the same
input in every run) and the final latent's departure from the noise.
"""

import pytest
import torch

import harness

CASES = harness.TESTS / "e2e" / "sample_cases.py"
COMFYUI = "0.30.0"
KITCHEN = "0.2.27"
STEPS = 3
QUANTIZED = 12  # block linears the quantized variants quantize (tiny_models.FluxSpec)
VARIANTS = ("bf16", "int8", "w4a8", "fp8")
# bf16 compute on the device against the fp32 CPU reference (quantization
# error is in both): the random model keeps this at 0.9999+, see the cosines
MIN_COSINE = 0.999

pytestmark = pytest.mark.skipif(not harness.torch_available(), reason="torch is not installed")

LEGS = {
    "cpu": dict(machine="cpu", args=["--fp32-check", "--lora"], flags=["--cpu"], env={"ASCEND_SHIM": "0"}),
    "shim": dict(machine="ascend-cu130", args=["--lora"], flags=[], env={}),
    "lowvram": dict(machine="ascend-cu130", args=["--variants", "int8,w4a8"],
                    flags=["--lowvram", "--reserve-vram", "64"], env={}),
    "noshim": dict(machine="ascend-cu130", args=[], flags=[], env={"ASCEND_SHIM": "0"}),
}


@pytest.fixture(scope="module")
def leg(bed_python, tmp_path_factory):
    done = {}

    def run(name):
        if name not in done:
            spec = LEGS[name]
            out = tmp_path_factory.mktemp("e2e-" + name)
            proc = harness.run(
                [str(bed_python), str(CASES), str(harness.comfyui_dir(COMFYUI)), str(out), "--arch", "flux",
                 "--steps", str(STEPS), *spec["args"], "--", *spec["flags"]],
                harness.bed_env(spec["machine"], kitchen=KITCHEN, **spec["env"]), out, timeout=600)
            report = harness.last_json(proc)
            report["out"] = out
            done[name] = report
        return done[name]

    return run


def outputs(report, variant):
    return torch.load(report["out"] / ("%s.pt" % variant))


def cosine(a, b):
    return float(torch.nn.functional.cosine_similarity(a.flatten().double(), b.flatten().double(), dim=0))


def cosines(report, variant, reference, ref_variant=None):
    mine, ref = outputs(report, variant), outputs(reference, ref_variant or variant)
    return {part: cosine(mine[part], ref[part]) for part in ("velocity", "latent")}


def sampled(report, variant):
    entry = report["variants"][variant]
    assert entry["stage"] == "done", entry
    assert entry["finite"], entry
    return entry


@pytest.mark.parametrize("name", ["cpu", "shim"])
def test_comfyui_detects_the_tiny_checkpoint_as_flux(leg, name):
    report = leg(name)
    assert report["startup"] == "ok"
    for variant in VARIANTS:
        entry = sampled(report, variant)
        assert entry["config"] == "Flux" and entry["model_class"] == "Flux"
        assert entry["unet_config"]["hidden_size"] == 256 and entry["unet_config"]["depth_single_blocks"] == 2
    layouts = {"int8": "TensorWiseINT8Layout", "w4a8": "AsymW4A8Int8Layout"}
    for variant, layout in layouts.items():
        assert report["variants"][variant]["layers"].get(layout) == QUANTIZED
    if name == "cpu":
        assert report["variants"]["fp8"]["layers"].get("TensorCoreFP8E4M3Layout") == QUANTIZED
    else:  # the shim decodes fp8 layers to bf16 on a 910B (ASCEND_SHIM_FP8=auto)
        assert report["variants"]["fp8"]["layers"] == {"torch.bfloat16": 34}


def test_random_model_is_numerically_stable_in_bf16(leg):
    """Modulation scaled down (tiny_models.MOD_SCALE): CPU bf16 agrees with fp32."""
    report = leg("cpu")
    sampled(report, "fp32")
    assert report["variants"]["bf16_compute"]["compute_dtype"] == "torch.bfloat16"
    found = cosines(report, "bf16_compute", report, "fp32")
    print("cpu bf16 vs fp32:", found)
    assert min(found.values()) >= MIN_COSINE


def test_shim_samples_every_variant_on_the_npu(leg):
    report = leg("shim")
    assert report["device"] == "npu:0"
    assert report["cuda_raised"] == []
    for variant in VARIANTS + ("int8_lora",):
        entry = sampled(report, variant)
        assert entry["compute_dtype"] == "torch.bfloat16"
        counters = entry["counters"]
        assert counters["fallbacks"] == {}, (variant, counters)
        assert counters["errors"] == [], (variant, counters)
        seen = entry["while_sampling"]
        # every weight (quantized ones' data and scales too) sits on the NPU while sampling
        assert set(seen["devices"]) == {"npu"}, (variant, seen)
        assert seen["float8_on_device"] == []
        assert seen["input_device"] == "npu:0"
        assert seen["npu_bytes"] > 4 * 2**20


@pytest.mark.parametrize("variant", ["int8", "w4a8", "int8_lora"])
def test_int8_and_w4a8_layers_run_on_the_npu_quant_ops(leg, variant):
    counters = leg("shim")["variants"][variant]["counters"]
    assert counters["quant_matmul"] >= QUANTIZED * STEPS, counters
    assert counters["dynamic_quant"] == counters["quant_matmul"], counters


@pytest.mark.parametrize("variant", ["bf16", "fp8"])
def test_unquantized_variants_use_no_quant_op(leg, variant):
    assert leg("shim")["variants"][variant]["counters"]["quant_matmul"] == 0


@pytest.mark.parametrize("variant", VARIANTS + ("int8_lora",))
def test_shim_output_matches_the_cpu_reference(leg, variant):
    found = cosines(leg("shim"), variant, leg("cpu"))
    print("shim %s vs cpu:" % variant, found)
    assert min(found.values()) >= MIN_COSINE, found


def test_lora_changes_the_int8_model_as_on_the_cpu(leg):
    shim, cpu = leg("shim"), leg("cpu")
    assert shim["variants"]["int8_lora"]["lora_patches"] == QUANTIZED
    lora_effect = 1 - cosine(outputs(shim, "int8_lora")["velocity"], outputs(shim, "int8")["velocity"])
    shim_error = 1 - cosines(shim, "int8_lora", cpu)["velocity"]
    print("LoRA effect (1 - cos):", lora_effect, "shim vs cpu (1 - cos):", shim_error)
    assert lora_effect > 10 * shim_error


@pytest.mark.parametrize("variant", ["int8", "w4a8"])
def test_lowvram_streams_weights_and_stays_on_the_npu_ops(leg, variant):
    report = leg("lowvram")
    assert report["vram_state"] == "LOW_VRAM"
    entry = sampled(report, variant)
    seen = entry["while_sampling"]
    assert seen["devices"].get("cpu", 0) > 0, seen  # offloaded: weights wait on the host
    assert seen["float8_on_device"] == []
    counters = entry["counters"]
    assert counters["fallbacks"] == {} and counters["errors"] == [], counters
    assert counters["quant_matmul"] >= QUANTIZED * STEPS, counters
    found = cosines(report, variant, leg("cpu"))
    print("lowvram %s vs cpu:" % variant, found)
    assert min(found.values()) >= MIN_COSINE, found


def test_without_the_shim_comfyui_fails_as_users_saw(leg):
    """0.30.0 picks the NPU itself, then loading any model asks CUDA for the
    device's properties: the CUDA build without a driver stops there."""
    report = leg("noshim")
    assert report["startup"] == "ok" and report["device"] == "npu:0"
    for variant in VARIANTS:
        entry = report["variants"][variant]
        print("ASCEND_SHIM=0 %s: stopped at %s: %s" % (variant, entry["stage"], entry.get("error")))
        assert entry["stage"] == "load"
        assert "Found no NVIDIA driver" in entry["error"]
    assert "get_device_properties" in report["cuda_raised"]
