"""A real sampling workflow, end to end, on the simulated 910B (issue 20, item 3).

The newest real ComfyUI (v0.33.0) and the comfy-kitchen it pins (0.2.31). ``tiny_models.py`` builds a
tiny random checkpoint of Flux.1 and of MiniMax-H3 with ComfyUI's own classes,
in bf16, int8_tensorwise, asym_w4a8_int8 (fp8 group scales) and float8_e4m3fn
variants; ``sample_cases.py`` loads each with ``comfy.sd.load_diffusion_model``
and samples 3 steps with ``comfy.sample.sample``. Flux samples on random
conditioning; MiniMax-H3 on the conditioning of ComfyUI's own MiniMax-H3 text
encoder (Qwen3-VL-32B's structure, 50 layers, at the tiny DiT's text width 64:
``tiny_text_encoder.model_qwen3vl_32b_at_tiny_width``), loaded with
``comfy.sd.load_clip`` and run as CLIPTextEncode does, in the legs that give
``text_encoder`` (the CPU reference's weights in fp32, the others' in bf16 as
the users' files are; ComfyUI computes the encoder in fp32 either way). Legs,
one fresh interpreter each:

  cpu      plain CPU without the shim (ASCEND_SHIM=0, --cpu): the fp32 reference
  shim     ascend-cu130 with the shim: what the user runs (bf16 compute)
  lowvram  shim, --lowvram with all VRAM reserved: the weights stream from the host
  noshim   ascend-cu130, ASCEND_SHIM=0: what users saw before the shim
  noshim-cpu-build  ascend-cpu (CPU torch + torch_npu), ASCEND_SHIM=0

Cosines compare the first step's velocity (the model's output for the same
input in every run) and the final latent's departure from the noise.
"""

import pytest
import torch

import harness

CASES = harness.TESTS / "e2e" / "sample_cases.py"
COMFYUI = harness.COMFYUI_NEWEST
KITCHEN = harness.COMFYUI_NEWEST_KITCHEN
STEPS = 3
ARCHS = ("flux", "minimax")
VARIANTS = ("bf16", "int8", "w4a8", "fp8")
# bf16 compute on the device against the fp32 CPU reference, quantization
# error included (the random models reach 0.9999+, see tiny_models.MOD_SCALE)
MIN_COSINE = 0.999

pytestmark = pytest.mark.skipif(not harness.torch_available(), reason="torch is not installed")

LEGS = {
    "cpu": dict(machine="cpu", args=["--fp32-check", "--lora"], flags=["--cpu"], env={"ASCEND_SHIM": "0"},
                text_encoder="fp32"),
    "shim": dict(machine="ascend-cu130", args=["--lora"], flags=[], env={}, text_encoder="bf16"),
    "lowvram": dict(machine="ascend-cu130", args=["--variants", "int8,w4a8"],
                    flags=["--lowvram", "--reserve-vram", "64"], env={}, text_encoder="bf16"),
    "noshim": dict(machine="ascend-cu130", args=[], flags=[], env={"ASCEND_SHIM": "0"}),
    # the vendor's setup: the CPU build of torch with torch_npu, no shim
    "noshim-cpu-build": dict(machine="ascend-cpu", args=[], flags=[], env={"ASCEND_SHIM": "0"}),
}


@pytest.fixture(scope="module")
def leg(bed_python, tmp_path_factory):
    done = {}

    def run(name, arch):
        if (name, arch) not in done:
            spec = LEGS[name]
            out = tmp_path_factory.mktemp("e2e-%s-%s" % (name, arch))
            encoder = ["--text-encoder", spec["text_encoder"]] if arch == "minimax" and "text_encoder" in spec else []
            proc = harness.run(
                [str(bed_python), str(CASES), str(harness.comfyui_dir(COMFYUI)), str(out), "--arch", arch,
                 "--steps", str(STEPS), *spec["args"], *encoder, "--", *spec["flags"]],
                harness.bed_env(spec["machine"], kitchen=KITCHEN, **spec["env"]), out, timeout=600)
            report = harness.last_json(proc)
            report["out"] = out
            print("leg %s/%s: %.1f s, %.1f s CPU in the child%s" % (
                name, arch, report["seconds"], report.get("cpu_seconds", 0),
                ", text encoder %.1f s" % report["text_encoder"]["seconds"] if "text_encoder" in report else ""))
            done[name, arch] = report
        return done[name, arch]

    return run


def outputs(report, variant):
    return torch.load(report["out"] / ("%s.pt" % variant))


def cosine(a, b):
    return float(torch.nn.functional.cosine_similarity(a.flatten().double(), b.flatten().double(), dim=0))


def cosines(report, variant, reference, ref_variant=None):
    mine, ref = outputs(report, variant), outputs(reference, ref_variant or variant)
    return {part: round(cosine(mine[part], ref[part]), 6) for part in ("velocity", "latent")}


def sampled(report, variant):
    entry = report["variants"][variant]
    assert entry["stage"] == "done", entry
    assert entry["finite"], entry
    return entry


EXPECTED = {"flux": ("Flux", "Flux"), "minimax": ("MiniMaxH3", "MiniMaxH3")}
LAYOUTS = {"int8": "TensorWiseINT8Layout", "w4a8": "AsymW4A8Int8Layout"}


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("name", ["cpu", "shim"])
def test_comfyui_detects_the_tiny_checkpoint(leg, name, arch):
    report = leg(name, arch)
    assert report["startup"] == "ok"
    quantized = report["quantized_layers"]
    assert quantized >= 8
    for variant in VARIANTS:
        entry = sampled(report, variant)
        assert (entry["config"], entry["model_class"]) == EXPECTED[arch]
        assert entry["unet_config"]["hidden_size"] == 256
    for variant, layout in LAYOUTS.items():
        assert report["variants"][variant]["layers"].get(layout) == quantized
    fp8_layers = report["variants"]["fp8"]["layers"]
    if name == "cpu":
        assert fp8_layers.get("TensorCoreFP8E4M3Layout") == quantized
    else:  # the shim decodes fp8 layers to bf16 on a 910B (ASCEND_SHIM_FP8=auto)
        assert fp8_layers == report["variants"]["bf16"]["layers"]


@pytest.mark.parametrize("arch", ARCHS)
def test_random_model_is_numerically_stable_in_bf16(leg, arch):
    """Modulation scaled down (tiny_models.MOD_SCALE): bf16 agrees with fp32.

    On the CPU ComfyUI computes a bf16 model in fp32 (manual cast), so the
    CPU pair checks the bf16 weights and the NPU run checks bf16 compute."""
    cpu, shim = leg("cpu", arch), leg("shim", arch)
    sampled(cpu, "fp32")
    weights = cosines(cpu, "bf16_compute", cpu, "fp32")
    compute = cosines(shim, "bf16", cpu, "fp32")
    print("%s: bf16 weights vs fp32 (cpu) %s; bf16 compute (npu) vs fp32 (cpu) %s" % (arch, weights, compute))
    assert min(weights.values()) >= MIN_COSINE and min(compute.values()) >= MIN_COSINE


@pytest.mark.parametrize("arch", ARCHS)
def test_shim_samples_every_variant_on_the_npu(leg, arch):
    report = leg("shim", arch)
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


@pytest.mark.parametrize("arch", ARCHS)
def test_attention_account_matches_the_path_torch_npu_took(leg, arch):
    # both models call SDPA with no mask in bf16: every call reaches the fused kernel,
    # and the after-prompt line says so with the bed's own count
    for variant in VARIANTS + ("int8_lora",):
        counters = leg("shim", arch)["variants"][variant]["counters"]
        paths = counters["sdpa_paths"]
        print("%s %s: %s; %s" % (arch, variant, paths, counters["attention_line"]))
        assert paths.get("math", 0) == 0 and paths["fused"] > 0, (variant, paths)
        assert counters["attention_line"] == (
            "attention: %d of %d SDPA calls on the NPU took torch_npu's fused kernel" % (
                paths["fused"], paths["fused"])), (variant, counters)


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("variant", ["int8", "w4a8", "int8_lora"])
def test_int8_and_w4a8_layers_run_on_the_npu_quant_ops(leg, arch, variant):
    report = leg("shim", arch)
    counters = report["variants"][variant]["counters"]
    assert counters["quant_matmul"] >= report["quantized_layers"] * STEPS, counters
    assert counters["dynamic_quant"] == counters["quant_matmul"], counters


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("variant", ["bf16", "fp8"])
def test_unquantized_variants_use_no_quant_op(leg, arch, variant):
    assert leg("shim", arch)["variants"][variant]["counters"]["quant_matmul"] == 0


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("variant", VARIANTS + ("int8_lora",))
def test_shim_output_matches_the_cpu_reference(leg, arch, variant):
    found = cosines(leg("shim", arch), variant, leg("cpu", arch))
    print("%s shim %s vs cpu: %s" % (arch, variant, found))
    assert min(found.values()) >= MIN_COSINE, found


@pytest.mark.parametrize("arch", ARCHS)
def test_lora_changes_the_int8_model_as_on_the_cpu(leg, arch):
    shim, cpu = leg("shim", arch), leg("cpu", arch)
    assert shim["variants"]["int8_lora"]["lora_patches"] == shim["quantized_layers"]
    lora_effect = 1 - cosine(outputs(shim, "int8_lora")["velocity"], outputs(shim, "int8")["velocity"])
    cpu_effect = 1 - cosine(outputs(cpu, "int8_lora")["velocity"], outputs(cpu, "int8")["velocity"])
    shim_error = 1 - cosines(shim, "int8_lora", cpu)["velocity"]
    print("%s LoRA effect (1 - cos): npu %.2e cpu %.2e; npu vs cpu %.2e" % (arch, lora_effect, cpu_effect,
                                                                          shim_error))
    assert lora_effect > 5 * shim_error
    assert 0.5 < lora_effect / cpu_effect < 2


@pytest.mark.parametrize("variant", ["int8", "w4a8"])
def test_lowvram_streams_weights_and_stays_on_the_npu_ops(leg, variant):
    report = leg("lowvram", "minimax")
    assert report["vram_state"] == "LOW_VRAM"
    entry = sampled(report, variant)
    seen = entry["while_sampling"]
    assert seen["devices"].get("cpu", 0) > 0, seen  # offloaded: weights wait on the host
    assert seen["float8_on_device"] == []
    counters = entry["counters"]
    assert counters["fallbacks"] == {} and counters["errors"] == [], counters
    assert counters["quant_matmul"] >= report["quantized_layers"] * STEPS, counters
    found = cosines(report, variant, leg("cpu", "minimax"))
    print("lowvram %s vs cpu: %s" % (variant, found))
    assert min(found.values()) >= MIN_COSINE, found


def test_without_the_shim_comfyui_fails_as_users_saw(leg):
    """ComfyUI picks the NPU itself, then loading any model asks CUDA for the
    device's properties: the CUDA build without a driver stops there."""
    report = leg("noshim", "minimax")
    assert report["startup"] == "ok" and report["device"] == "npu:0"
    for variant in VARIANTS:
        entry = report["variants"][variant]
        print("ASCEND_SHIM=0 %s: stopped at %s: %s" % (variant, entry["stage"], entry.get("error")))
        assert entry["stage"] == "load"
        assert "Found no NVIDIA driver" in entry["error"]
    assert "get_device_properties" in report["cuda_raised"]


def test_without_the_shim_on_the_cpu_build_int8_falls_back_and_fp8_stops(leg):
    """With the CPU build of torch the driver probe passes; then INT8 runs
    ``aten::_int_mm`` on the host and any float8 tensor stops on the 910B."""
    report = leg("noshim-cpu-build", "minimax")
    assert report["device"] == "npu:0"
    for variant in VARIANTS:
        entry = report["variants"][variant]
        print("ASCEND_SHIM=0, CPU torch %s: %s %s %s" % (variant, entry["stage"], entry.get("error", ""),
                                                         entry["counters"]))
    assert sampled(report, "bf16")["counters"]["fallbacks"] == {}
    int8 = sampled(report, "int8")["counters"]
    assert int8["quant_matmul"] == 0
    assert int8["fallbacks"].get("aten::_int_mm", 0) >= report["quantized_layers"] * STEPS
    for variant in ("w4a8", "fp8"):  # W4A8's fp8 group scales, fp8 weights
        entry = report["variants"][variant]
        assert entry["stage"] == "sample" and "Float8_e4m3fn has not been supported" in entry["error"], entry


# ------------------------------------------------------------------ MiniMax-H3's own text encoder

TEXT_WIDTH = 64  # tiny_models.MiniMaxH3Spec.config["text_dim"]
LM_LAYERS = 50  # Qwen3-VL-32B truncated to 50 layers, as MiniMax-H3 ships it


def encoded(report):
    """The text-encoder entry of a MiniMax-H3 leg, encoded without error."""
    entry = report.get("text_encoder")
    assert entry is not None, "the leg sampled without ComfyUI's text encoder"
    assert entry["stage"] == "done", entry
    return entry


@pytest.mark.parametrize("name", ["cpu", "shim"])
def test_minimax_conditions_on_comfyuis_own_text_encoder(leg, name):
    """load_clip(CLIPType.MINIMAX) detects the tiny file as Qwen3-VL-32B and
    builds ComfyUI's MiniMax-H3 encoder; every weight of the file is loaded."""
    entry = encoded(leg(name, "minimax"))
    print("%s text encoder: %s %s, %d weights, %d parameters, %s; cond %s; encode %.2f s" % (
        name, entry["te_model"], entry["classes"], entry["weights"], entry["parameters"], entry["weight_dtypes"],
        entry["cond"], entry["encode_seconds"]))
    assert entry["te_model"] == "QWEN3VL_32B"
    assert entry["classes"] == ["MiniMaxH3TEModel", "MiniMaxH3ClipModel", "MiniMaxQwen3VL"]
    assert (entry["lm_layers"], entry["width"]) == (LM_LAYERS, TEXT_WIDTH)
    assert (entry["missing"], entry["unexpected"], entry["differing"], entry["load_log"]) == ([], [], [], [])
    assert entry["weight_dtypes"] == ["torch.float32" if name == "cpu" else "torch.bfloat16"]
    cond = entry["cond"]
    assert cond["shape"] == [1, entry["tokens"], TEXT_WIDTH] and entry["tokens"] > 4 and cond["finite"]
    assert "minimax_token_tags" in entry["cond_keys"] and entry["token_tags"] == [1] * entry["tokens"]
    assert entry["negative_shape"] == [1, 1, TEXT_WIDTH]  # the empty prompt: one pad token


def test_minimax_text_encoder_runs_on_the_npu_with_the_shim(leg):
    """On the simulated 910B the encoder's weights sit on the NPU while it
    encodes, with no CPU fallback and no float8 tensor there; its attention
    (a causal float mask) is accounted for with the bed's own count."""
    entry = encoded(leg("shim", "minimax"))
    seen, counters = entry["while_encoding"], entry["counters"]
    print("text encoder on the npu: %s; %s" % (seen, counters))
    assert entry["load_device"] == "npu:0"
    assert set(seen["devices"]) == {"npu"}, seen
    assert seen["input_device"] == "npu:0" and seen["float8_on_device"] == []
    # ComfyUI computes its LLM encoders in fp32 (fp32 token embeddings; manual_cast casts each bf16
    # weight to them) on any device: the shim leaves that alone
    assert seen["input_dtype"] == "torch.float32", seen
    assert counters["fallbacks"] == {} and counters["errors"] == [], counters
    # one SDPA call per LM layer and prompt; the empty prompt (one token) has no mask and
    # takes the fused kernel, the prompt's causal mask is filled with finfo.min / 4 (not
    # -inf), so the shim cannot hand it over as a bool mask: those calls take the math path
    paths = counters["sdpa_paths"]
    assert sum(paths.values()) == 2 * LM_LAYERS and paths.get("fused", 0) >= LM_LAYERS, paths
    line = "attention: %d of %d SDPA calls on the NPU took torch_npu's fused kernel" % (
        paths.get("fused", 0), sum(paths.values()))
    if paths.get("math"):
        line += "; unfused math path: %d float mask with values other than 0 and -inf (or a row with no 0)" % (
            paths["math"])
    assert counters["attention_line"] == line, counters


def test_minimax_text_encoder_conditioning_matches_the_cpu_reference(leg):
    """bf16 weights on the NPU against fp32 weights on the CPU (both computed in fp32, as
    ComfyUI computes its LLM encoders: the difference is the weights' bf16 rounding and the
    NPU's kernels)."""
    encoded(leg("cpu", "minimax")), encoded(leg("shim", "minimax"))
    shim = torch.load(leg("shim", "minimax")["out"] / "conditioning.pt")
    cpu = torch.load(leg("cpu", "minimax")["out"] / "conditioning.pt")
    found = {part: round(cosine(shim[part], cpu[part]), 6) for part in ("positive", "negative")}
    print("text encoder conditioning, npu bf16 vs cpu fp32: %s" % found)
    assert min(found.values()) >= MIN_COSINE, found
