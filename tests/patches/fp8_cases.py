"""Every fp8 entry point of a real ComfyUI, run once on the simulated machine.

    python fp8_cases.py <comfyui-dir> [-- --fp8_e4m3fn-unet ...]

Writes fp8 files of ComfyUI 0.30's three kinds (legacy ``scaled_fp8``,
``comfy_quant`` float8 via ``_quantization_metadata``, unscaled fp8) for a
tiny Wan 2.1 diffusion model and a CLIP-L text encoder (keys and shapes read
off ComfyUI's own classes, weights random), loads each through ComfyUI's own
loaders (comfy.sd; torchvision / torchaudio stood in for by
testbed.absent_packages), runs it on ComfyUI's device and compares the output
with ComfyUI's class run in float32 on the CPU on the weights the fp8 file
stands for (fp8 values times scales). Prints one JSON object:
per case ``{"ok": ..., "cos": ..., "weights": {dtype on device: count},
"weight_bytes": ..., "weight_elements": ..., "quant_matmul": ...}`` or
``{"error": "<type>: <message>"}``; plus the shim's fp8 patch states.
"""

import json
import os
import sys
import tempfile
import time
import traceback

from comfyui_start import start_comfyui  # noqa: E402

COMFY_DIR = sys.argv[1]
FLAGS = sys.argv[sys.argv.index("--") + 1:] if "--" in sys.argv else []
start_comfyui(COMFY_DIR, FLAGS)  # real comfy.sd imports torchvision/torchaudio: stood in for
import comfy.model_management as mm  # noqa: E402
import torch  # noqa: E402
import safetensors.torch  # noqa: E402

import importlib  # noqa: E402

import comfy.lora  # noqa: E402
import comfy.ops  # noqa: E402
import comfy.utils  # noqa: E402

try:
    import torch_npu
except ImportError:  # a machine without the simulated NPU
    torch_npu = None

WIDTH, FFN, DEPTH, LATENT = 256, 512, 2, 16  # a tiny Wan 2.1 t2v: 2 heads of 128, 2 blocks
IN = 64  # the Linear cases' input width
FP8_MAX = {torch.float8_e4m3fn: 448.0, torch.float8_e5m2: 57344.0}
DEVICE = mm.get_torch_device()
ACTIVATIONS = torch.bfloat16 if DEVICE.type == "npu" else torch.float32  # the Linear cases' compute dtype
_FILES = tempfile.TemporaryDirectory()  # removed at exit: each run writes ~800 MB
FOLDER = _FILES.name


def loaders():
    """``comfy.sd``, imported by the cases that load files (it imports every model)."""
    return importlib.import_module("comfy.sd")


def heavy_tailed(shape, generator):
    """Student-t (3 degrees of freedom) weights: the outliers real checkpoints have."""
    normal = torch.randn(shape, generator=generator)
    chi2 = sum(torch.randn(shape, generator=generator) ** 2 for _ in range(3))
    return normal / torch.sqrt(chi2 / 3) * 0.03


def to_fp8(weight, dtype=torch.float8_e4m3fn):
    scale = weight.abs().max() / FP8_MAX[dtype]
    return (weight / scale).to(dtype), scale.to(torch.float32)


def fp8_layers(layers, seed, dtypes=None):
    """{layer: (fp8 weight, scale, fp32 reference)}; odd layers heavy-tailed."""
    generator = torch.Generator().manual_seed(seed)
    out = {}
    for i, (name, shape) in enumerate(layers.items()):
        weight = heavy_tailed(shape, generator) if i % 2 else torch.randn(shape, generator=generator) * 0.03
        dtype = (dtypes or {}).get(name, torch.float8_e4m3fn)
        q, scale = to_fp8(weight, dtype)
        out[name] = (q, scale, q.to(torch.float32) * scale)
    return out


def cosine(a, b):
    a, b = a.double().flatten(), b.double().flatten()
    return float(a @ b / (a.norm() * b.norm()))


def save(name, sd, metadata=None):
    path = os.path.join(FOLDER, name + ".safetensors")
    safetensors.torch.save_file({k: v.contiguous() for k, v in sd.items()}, path, metadata=metadata)
    return path


def wan(dtype=torch.float32, device=None):
    """ComfyUI's own Wan 2.1 t2v class at the tiny size its detector reads back from the weights."""
    from comfy.ldm.wan.model import WanModel

    return WanModel(model_type="t2v", dim=WIDTH, ffn_dim=FFN, num_heads=WIDTH // 128, num_layers=DEPTH,
                    in_dim=LATENT, out_dim=LATENT, operations=comfy.ops.disable_weight_init,
                    dtype=dtype, device=device)


def diffusion_parts(seed, dtypes=None):
    """A Wan 2.1 state dict as fp8 releases ship it: every Linear weight fp8 (layers), the rest
    bf16 (others), so that fp8 is the file's weight dtype (comfy.utils.weight_dtype counts
    elements). Keys are the real model's, shapes read off ComfyUI's class."""
    shapes = {k: tuple(v.shape) for k, v in wan(device="meta").state_dict().items()}
    linear = {k[:-len(".weight")]: s for k, s in shapes.items() if k.endswith(".weight") and len(s) == 2}
    layers = fp8_layers(linear, seed, dtypes)
    generator = torch.Generator().manual_seed(seed + 1)
    others = {}
    for key, shape in shapes.items():
        if key[:-len(".weight")] in linear:
            continue
        if "norm" in key and key.endswith("weight"):
            value = 1 + 0.1 * torch.randn(shape, generator=generator)
        else:
            value = torch.randn(shape, generator=generator) * (0.01 if key.endswith("bias") else 0.03)
        others[key] = value.to(torch.bfloat16)
    return layers, others


def run_diffusion(patcher, layers, others, extra_weights=None):
    """The loaded model on ComfyUI's device against ComfyUI's class in float32 on the CPU, holding
    the weights the fp8 file stands for."""
    mm.load_models_gpu([patcher])
    generator = torch.Generator().manual_seed(7)
    x = torch.randn(1, LATENT, 1, 8, 8, generator=generator)
    context = torch.randn(1, 8, 4096, generator=generator)
    timestep = torch.tensor([500.0])
    dtype = patcher.model.manual_cast_dtype or patcher.model.get_dtype()
    out = patcher.model.diffusion_model(x.to(DEVICE, dtype), timestep.to(DEVICE), context.to(DEVICE, dtype))
    weights = {k: v.float() for k, v in others.items()}
    weights.update({n + ".weight": v[2] for n, v in layers.items()})
    for name, delta in (extra_weights or {}).items():
        weights[name + ".weight"] = weights[name + ".weight"] + delta
    reference = wan()
    reference.load_state_dict(weights)
    ref = reference(x, timestep, context)
    return {"ok": True, "cos": cosine(out.float().cpu(), ref), "dtype": str(dtype), **device_summary(patcher.model)}


def device_summary(model):
    """Storage dtype@device of each parameter; bytes the 2-D weights (and their scales) take."""
    kinds = {}
    elements = nbytes = 0
    for name, param in model.named_parameters():
        storage = getattr(param, "_qdata", param)
        key = "%s@%s" % (str(storage.dtype).replace("torch.", ""), storage.device.type)
        kinds[key] = kinds.get(key, 0) + 1
        if name.endswith("weight") and param.dim() == 2:
            elements += param.numel()
            nbytes += storage.nbytes
            scale = getattr(getattr(param, "_params", None), "scale", None)
            if isinstance(scale, torch.Tensor):
                nbytes += scale.nbytes
    summary = {"weights": kinds, "weight_elements": elements, "weight_bytes": nbytes}
    if torch_npu is not None:
        summary["quant_matmul"] = torch_npu._testbed.calls["npu_quant_matmul"]
    return summary


def scaled_fp8_sd(layers, prefix=""):
    """The legacy ``scaled_fp8`` form: fp8 weights, ``scale_weight`` and the marker tensor."""
    sd = {prefix + "scaled_fp8": torch.empty(0, dtype=torch.float8_e4m3fn)}
    for name, (q, scale, _) in layers.items():
        sd[prefix + name + ".weight"] = q
        sd[prefix + name + ".scale_weight"] = scale.reshape(1)
    return sd


def case_checkpoint_scaled_fp8():
    """A checkpoint file (``model.diffusion_model.`` keys) in the legacy scaled_fp8 form."""
    layers, others = diffusion_parts(1)
    sd = scaled_fp8_sd(layers, "model.diffusion_model.")
    sd.update({"model.diffusion_model." + k: v for k, v in others.items()})
    model, clip = loaders().load_checkpoint_guess_config(save("checkpoint", sd), output_clip=False,
                                                         output_vae=False)[:2]
    return run_diffusion(model, layers, others)


def comfy_quant_file(seed):
    """comfy_quant float8 via ``_quantization_metadata``; the FFN output layers e5m2."""
    shapes = {k[:-len(".weight")] for k in wan(device="meta").state_dict() if ".ffn.2." in k}
    layers, others = diffusion_parts(seed, dtypes={n: torch.float8_e5m2 for n in shapes})
    sd, conf = dict(others), {}
    for name, (q, scale, _) in layers.items():
        sd[name + ".weight"] = q
        sd[name + ".weight_scale"] = scale
        conf[name] = {"format": "float8_e5m2" if q.dtype == torch.float8_e5m2 else "float8_e4m3fn"}
    metadata = {"_quantization_metadata": json.dumps({"layers": conf})}
    return save("comfy_quant_%d" % seed, sd, metadata), layers, others


def case_diffusion_comfy_quant():
    """A diffusion model with per-layer comfy_quant float8 (e4m3fn and e5m2) metadata."""
    path, layers, others = comfy_quant_file(4)
    return run_diffusion(loaders().load_diffusion_model(path), layers, others)


def unscaled_fp8(layers):
    """The weights themselves cast to fp8, no scale (what an unscaled fp8 file holds)."""
    out = {}
    for name, (_, _, weight) in layers.items():
        q = weight.to(torch.float8_e4m3fn)
        out[name] = (q, None, q.to(torch.float32))
    return out


def case_diffusion_unscaled():
    """An fp8 diffusion model without scales (plain fp8 weights)."""
    layers, others = diffusion_parts(5)
    unscaled = unscaled_fp8(layers)
    sd = {name + ".weight": q for name, (q, _, _) in unscaled.items()}
    sd.update(others)
    return run_diffusion(loaders().load_diffusion_model(save("unscaled", sd)), unscaled, others)


def clip_l_parts(seed):
    """CLIP-L as its files hold it (``text_model.`` keys, shapes read off ComfyUI's SD1 CLIP):
    the encoder layers' Linear weights as fp8 layers, the rest float32."""
    import comfy.sd1_clip

    shapes = {k[len("transformer."):]: tuple(v.shape)
              for k, v in comfy.sd1_clip.SDClipModel(device="meta").state_dict().items()
              if k.startswith("transformer.")}
    linear = {k[:-len(".weight")]: s for k, s in shapes.items()
              if ".encoder.layers." in k and k.endswith(".weight") and len(s) == 2}
    layers = fp8_layers(linear, seed)
    generator = torch.Generator().manual_seed(seed + 1)
    others = {}
    for key, shape in shapes.items():
        if key[:-len(".weight")] in linear:
            continue
        if "norm" in key and key.endswith("weight"):
            others[key] = 1 + 0.1 * torch.randn(shape, generator=generator)
        else:
            others[key] = torch.randn(shape, generator=generator) * (0.01 if key.endswith("bias") else 0.02)
    return layers, others


def text_reference(layers, others, tokens):
    """ComfyUI's SD1 CLIP in float32 on the CPU, holding the weights the file stands for."""
    import comfy.sd1_clip

    weights = dict(others)
    weights.update({n + ".weight": v[2] for n, v in layers.items()})
    reference = comfy.sd1_clip.SD1ClipModel(device="cpu", dtype=torch.float32)
    reference.load_sd(weights)
    return reference.encode_token_weights(tokens)[0]


def encode(clip, layers, others):
    tokens = clip.tokenize("a photograph of an astronaut riding a horse")
    out = clip.encode_from_tokens(tokens).float().cpu()
    return cosine(out, text_reference(layers, others, tokens))


def case_text_encoder():
    """A CLIP-L text encoder through load_clip: legacy scaled_fp8 and unscaled fp8 files."""
    result = {"ok": True}
    for kind, scaled in (("scaled", True), ("unscaled", False)):
        layers, others = clip_l_parts(10 + scaled)
        if scaled:
            sd = scaled_fp8_sd(layers)
        else:
            layers = unscaled_fp8(layers)
            sd = {n + ".weight": q for n, (q, _, _) in layers.items()}
        sd.update(others)
        clip = loaders().load_clip([save("text_%s" % kind, sd)])
        result[kind + "_cos"] = encode(clip, layers, others)
        result[kind + "_device"] = str(clip.patcher.load_device)
        result[kind + "_weights"] = device_summary(clip.cond_stage_model)["weights"]
    result["cos"] = min(result["scaled_cos"], result["unscaled_cos"])
    return result


# run_forward_note: ComfyUI runs a model's forward under inference_mode (its executor), where
# aten::linear reaches kitchen's QuantizedTensor whole; outside it a bias-free linear decomposes
# and torch_npu's own aten::matmul kernel takes the product whole (kitchen dequantizes for matmul).


def case_mixed_linear():
    """ComfyUI's own unit-test shape: convert_old_quants(metadata) + mixed_precision_ops({}).Linear."""
    layers = fp8_layers({"layer1": (WIDTH, IN), "layer3": (WIDTH, WIDTH)}, 20)
    sd = {}
    for name, (q, scale, _) in layers.items():
        sd[name + ".weight"] = q
        sd[name + ".weight_scale"] = scale
    conf = {name: {"format": "float8_e4m3fn"} for name in layers}
    sd, _ = comfy.utils.convert_old_quants(sd, metadata={"_quantization_metadata": json.dumps({"layers": conf})})
    ops = comfy.ops.mixed_precision_ops({})
    model = torch.nn.Module()
    model.layer1 = ops.Linear(IN, WIDTH, bias=False)
    model.layer3 = ops.Linear(WIDTH, WIDTH, bias=False)
    model.load_state_dict(sd, strict=False)
    model.to(DEVICE)
    x = torch.randn(4, IN, generator=torch.Generator().manual_seed(21))
    with torch.inference_mode():  # the forward as a prompt runs it (see run_forward_note)
        out = model.layer3(model.layer1(x.to(ACTIVATIONS).to(DEVICE))).float().cpu()
    ref = (x @ layers["layer1"][2].T) @ layers["layer3"][2].T
    return {"ok": True, "cos": cosine(out, ref), **device_summary(model)}


def case_mixed_linear_direct():
    """A comfy_quant state dict loaded straight into the Linear, without convert_old_quants."""
    (q, scale, ref_weight), = fp8_layers({"layer": (WIDTH, IN)}, 22).values()
    conf = torch.tensor(list(json.dumps({"format": "float8_e4m3fn"}).encode()), dtype=torch.uint8)
    layer = comfy.ops.mixed_precision_ops({}).Linear(IN, WIDTH, bias=False)
    layer.load_state_dict({"weight": q, "weight_scale": scale, "comfy_quant": conf}, strict=False)
    layer.to(DEVICE)
    x = torch.randn(4, IN, generator=torch.Generator().manual_seed(23))
    with torch.inference_mode():  # the forward as a prompt runs it (see run_forward_note)
        out = layer(x.to(ACTIVATIONS).to(DEVICE)).float().cpu()
    return {"ok": True, "cos": cosine(out, x @ ref_weight.T), **device_summary(layer)}


def case_w4a8_layer():
    """An asym_w4a8_int8 layer: int8 codes with float8 group scales stored as bytes, as files do."""
    import comfy_kitchen as ck

    if "asym_w4a8_int8" not in comfy.ops.QUANT_ALGOS:
        return {"skipped": "this ComfyUI / comfy-kitchen has no asym_w4a8_int8"}
    weight = torch.randn(WIDTH, WIDTH, generator=torch.Generator().manual_seed(50)) * 0.03
    qdata, s_rel, s_channel, correction, codebook = ck.quantize_w4a8_int8_weight(weight)
    conf = {"format": "asym_w4a8_int8", "group_size": 16, "convrot": True, "convrot_groupsize": 256}
    sd = {"weight": qdata, "weight_s_rel": s_rel.view(torch.uint8), "weight_s_channel": s_channel,
          "weight_codebook": codebook, "comfy_quant": torch.tensor(list(json.dumps(conf).encode()), dtype=torch.uint8)}
    reference = ck.dequantize_w4a8_int8_weight(qdata, s_rel, s_channel, codebook=codebook, correction=correction,
                                               output_dtype=torch.float32)
    layer = comfy.ops.mixed_precision_ops({}).Linear(WIDTH, WIDTH, bias=False)
    layer.load_state_dict(sd, strict=False)
    layer.to(DEVICE)
    x = torch.randn(4, WIDTH, generator=torch.Generator().manual_seed(51))
    with torch.inference_mode():  # the forward as a prompt runs it (see run_forward_note)
        out = layer(x.to(ACTIVATIONS).to(DEVICE)).float().cpu()
    scale = layer.weight._params.scale
    where = "%s@%s" % (str(scale.dtype).replace("torch.", ""), scale.device.type)
    return {"ok": True, "cos": cosine(out, x @ reference.T), "s_rel": where, **device_summary(layer)}


def case_lora():
    """A LoRA on a comfy_quant float8 layer, keyed and applied by ComfyUI's own LoRA code."""
    path, layers, others = comfy_quant_file(30)
    # the output head: every block's path is gated by modulation, so a LoRA there barely shows in a
    # random model's output; the head's does, and it is a comfy_quant float8 Linear like the others
    target = "head.head"
    generator = torch.Generator().manual_seed(31)
    out_features, in_features = layers[target][2].shape
    up = torch.randn(out_features, 8, generator=generator) * 0.5
    down = torch.randn(8, in_features, generator=generator) * 0.5
    lora = {"diffusion_model.%s.lora_up.weight" % target: up, "diffusion_model.%s.lora_down.weight" % target: down}
    patcher = loaders().load_diffusion_model(path).clone()
    loaded = comfy.lora.load_lora(lora, comfy.lora.model_lora_keys_unet(patcher.model, {}))
    added = patcher.add_patches(loaded, 0.8)
    delta = {target: 0.8 * (up @ down)}
    result = run_diffusion(patcher, layers, others, extra_weights=delta)
    result["patched"] = sorted(added)
    without = run_diffusion(loaders().load_diffusion_model(path), layers, others, extra_weights=delta)
    result["cos_without_lora"] = without["cos"]
    return result


def bf16_diffusion_file():
    layers, others = diffusion_parts(40)
    exact = {n: (None, None, v[2].to(torch.bfloat16).float()) for n, v in layers.items()}
    sd = {name + ".weight": v[2].to(torch.bfloat16) for name, v in exact.items()}
    sd.update(others)
    return save("bf16_diffusion", sd), exact, others


def case_weight_dtype_option():
    """The Load Diffusion Model node's weight_dtype fp8_e4m3fn on a bf16 file."""
    path, layers, others = bf16_diffusion_file()
    patcher = loaders().load_diffusion_model(path, model_options={"dtype": torch.float8_e4m3fn})
    return run_diffusion(patcher, layers, others)


def case_flags():
    """bf16/float32 files under the command line's --fp8_* flags (the caller passes them)."""
    path, layers, others = bf16_diffusion_file()
    result = run_diffusion(loaders().load_diffusion_model(path), layers, others)
    te_layers, te_others = clip_l_parts(41)
    exact = {n: (None, None, v[2].to(torch.bfloat16).float()) for n, v in te_layers.items()}
    sd = {n + ".weight": v[2].to(torch.bfloat16) for n, v in exact.items()}
    sd.update(te_others)
    clip = loaders().load_clip([save("bf16_text", sd)])
    result["text_cos"] = encode(clip, exact, te_others)
    result["text_device"] = str(clip.patcher.load_device)
    result["text_weights"] = device_summary(clip.cond_stage_model)["weights"]
    result["unet_dtype"] = str(mm.unet_dtype())
    result["text_encoder_dtype"] = str(mm.text_encoder_dtype(DEVICE))
    return result


CASES = {name[len("case_"):]: fn for name, fn in sorted(globals().items()) if name.startswith("case_")}


def run(name):
    if torch_npu is not None:
        torch_npu._testbed.reset()
    try:
        return CASES[name]()
    except Exception as exc:
        return {"error": "%s: %s" % (type(exc).__name__, str(exc).splitlines()[0] if str(exc) else ""),
                "trace": traceback.format_exc()[-1500:]}


def fp8_status():
    try:
        from ascend_shim.startup import hook
    except ImportError:
        return None
    engine = hook.engine(start=False)
    if engine is None:
        return None
    return {r["name"]: {"state": r["state"], "reason": r.get("reason")}
            for r in engine.patch_status() if r["name"].startswith("fp8_")}


wanted = [c for c in os.environ.get("FP8_CASES", ",".join(CASES)).split(",") if c]
results = {}
with torch.no_grad():  # ComfyUI loads outside inference mode
    for name in wanted:
        started = time.monotonic()
        results[name] = run(name)
        results[name]["seconds"] = round(time.monotonic() - started, 2)
print(json.dumps({"device": str(DEVICE), "cases": results, "status": fp8_status()}))
