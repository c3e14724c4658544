"""Every fp8 entry point of a (fake or real) ComfyUI, run once on the simulated machine.

    python fp8_cases.py <comfyui-dir> [-- --fp8_e4m3fn-unet ...]

Writes fp8 checkpoints of ComfyUI 0.30's three kinds (legacy ``scaled_fp8``,
``comfy_quant`` float8 via ``_quantization_metadata``, unscaled fp8) for the
tiny models of the fake ``comfy.sd``, loads each through ComfyUI's own
loaders, runs it on ComfyUI's device and compares the output with a float32
reference computed from the fp8 weights and scales. Prints one JSON object:
per case ``{"ok": ..., "cos": ..., "weights": {dtype on device: count},
"weight_bytes": ..., "weight_elements": ..., "quant_matmul": ...}`` or
``{"error": "<type>: <message>"}``; plus the shim's fp8 patch states.
"""

import json
import os
import sys
import tempfile
import traceback

COMFY_DIR = sys.argv[1]
FLAGS = sys.argv[sys.argv.index("--") + 1:] if "--" in sys.argv else []
sys.path.insert(0, COMFY_DIR)
sys.argv = [os.path.join(COMFY_DIR, "main.py")] + FLAGS

import comfy.options  # noqa: E402

comfy.options.enable_args_parsing()
import comfy.model_management as mm  # noqa: E402
import torch  # noqa: E402
import safetensors.torch  # noqa: E402

import importlib  # noqa: E402

import comfy.ops  # noqa: E402
import comfy.utils  # noqa: E402

try:
    import torch_npu
except ImportError:  # a machine without the simulated NPU
    torch_npu = None

WIDTH, IN, DEPTH, VOCAB = 256, 64, 2, 96
LAYERS = {"proj_in": (WIDTH, IN), **{"blocks.%d" % i: (WIDTH, WIDTH) for i in range(DEPTH)}, "proj_out": (IN, WIDTH)}
TE_LAYERS = {"blocks.%d" % i: (WIDTH, WIDTH) for i in range(DEPTH)}
FP8_MAX = {torch.float8_e4m3fn: 448.0, torch.float8_e5m2: 57344.0}
DEVICE = mm.get_torch_device()
ACTIVATIONS = torch.bfloat16 if DEVICE.type == "npu" else torch.float32  # ComfyUI's compute dtype there
FOLDER = tempfile.mkdtemp()


def loaders():
    """``comfy.sd``, imported by the cases that load files (a real one imports every model)."""
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


def diffusion_reference(weights, biases, norm, x):
    y = x @ weights["proj_in"].T + biases["proj_in"]
    for i in range(DEPTH):
        name = "blocks.%d" % i
        y = y + torch.nn.functional.gelu(y @ weights[name].T + biases[name])
    y = y * norm
    return y @ weights["proj_out"].T + biases["proj_out"]


def text_reference(weights, table, tokens):
    y = table[tokens]
    for i in range(DEPTH):
        y = y + torch.nn.functional.gelu(y @ weights["blocks.%d" % i].T)
    return y


def cosine(a, b):
    a, b = a.double().flatten(), b.double().flatten()
    return float(a @ b / (a.norm() * b.norm()))


def save(name, sd, metadata=None):
    path = os.path.join(FOLDER, name + ".safetensors")
    safetensors.torch.save_file({k: v.contiguous() for k, v in sd.items()}, path, metadata=metadata)
    return path


def diffusion_parts(seed, dtypes=None):
    layers = fp8_layers(LAYERS, seed, dtypes)
    generator = torch.Generator().manual_seed(seed + 1)
    biases = {n: (torch.randn(s[0], generator=generator) * 0.01).to(torch.bfloat16) for n, s in LAYERS.items()}
    norm = (1 + 0.1 * torch.randn(WIDTH, generator=generator)).to(torch.bfloat16)
    return layers, biases, norm


def run_diffusion(patcher, layers, biases, norm, extra_weights=None):
    mm.load_models_gpu([patcher])
    x = torch.randn(8, IN, generator=torch.Generator().manual_seed(7))
    out = patcher.model(x.to(ACTIVATIONS).to(DEVICE)).float().cpu()
    weights = {n: v[2] for n, v in layers.items()}
    for name, delta in (extra_weights or {}).items():
        weights[name] = weights[name] + delta
    ref = diffusion_reference(weights, {k: v.float() for k, v in biases.items()}, norm.float(), x)
    return {"ok": True, "cos": cosine(out, ref), **device_summary(patcher.model)}


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


def case_checkpoint_scaled_fp8():
    """A full checkpoint in the legacy scaled_fp8 form: diffusion model and text encoder."""
    layers, biases, norm = diffusion_parts(1)
    te = fp8_layers(TE_LAYERS, 2)
    table = torch.randn(VOCAB, WIDTH, generator=torch.Generator().manual_seed(3)).to(torch.bfloat16)
    sd = {}
    for prefix, parts in (("model.diffusion_model.", layers), ("text_encoders.tiny.", te)):
        for name, (q, scale, _) in parts.items():
            sd[prefix + name + ".weight"] = q
            sd[prefix + name + ".scale_weight"] = scale.reshape(1)
        sd[prefix + "scaled_fp8"] = torch.empty(0, dtype=torch.float8_e4m3fn)
    for name, bias in biases.items():
        sd["model.diffusion_model." + name + ".bias"] = bias
    sd["model.diffusion_model.norm_weight"] = norm
    sd["text_encoders.tiny.shared.weight"] = table
    model, clip = loaders().load_checkpoint_guess_config(save("checkpoint", sd))
    result = run_diffusion(model, layers, biases, norm)
    tokens = torch.tensor([[1, 5, 9, 42]])
    out = clip.encode(tokens).float().cpu()
    result["text_cos"] = cosine(out, text_reference({n: v[2] for n, v in te.items()}, table.float(), tokens))
    result["text_device"] = str(clip.patcher.load_device)
    return result


def comfy_quant_file(seed):
    layers, biases, norm = diffusion_parts(seed, dtypes={"proj_out": torch.float8_e5m2})
    sd, conf = {}, {}
    for name, (q, scale, _) in layers.items():
        sd[name + ".weight"] = q
        sd[name + ".weight_scale"] = scale
        sd[name + ".bias"] = biases[name]
        conf[name] = {"format": "float8_e5m2" if q.dtype == torch.float8_e5m2 else "float8_e4m3fn"}
    sd["norm_weight"] = norm
    metadata = {"_quantization_metadata": json.dumps({"layers": conf})}
    return save("comfy_quant_%d" % seed, sd, metadata), layers, biases, norm


def case_diffusion_comfy_quant():
    """A diffusion model with per-layer comfy_quant float8 (e4m3fn and e5m2) metadata."""
    path, layers, biases, norm = comfy_quant_file(4)
    return run_diffusion(loaders().load_diffusion_model(path), layers, biases, norm)


def case_diffusion_unscaled():
    """An fp8 diffusion model without scales (plain fp8 weights)."""
    layers, biases, norm = diffusion_parts(5)
    sd = {name + ".weight": q for name, (q, _, _) in layers.items()}
    sd.update({name + ".bias": b for name, b in biases.items()}, norm_weight=norm)
    unscaled = {name: (q, None, q.to(torch.float32)) for name, (q, _, _) in layers.items()}
    return run_diffusion(loaders().load_diffusion_model(save("unscaled", sd)), unscaled, biases, norm)


def text_file(seed, scaled):
    te = fp8_layers(TE_LAYERS, seed)
    table = torch.randn(VOCAB, WIDTH, generator=torch.Generator().manual_seed(seed)) * 0.5
    table_fp8 = table.to(torch.float8_e4m3fn)
    sd = {"shared.weight": table_fp8}
    for name, (q, scale, _) in te.items():
        sd[name + ".weight"] = q
        if scaled:
            sd[name + ".scale_weight"] = scale.reshape(1)
    if scaled:
        sd["scaled_fp8"] = torch.empty(0, dtype=torch.float8_e4m3fn)
    else:
        te = {n: (q, None, q.to(torch.float32)) for n, (q, _, _) in te.items()}
    return save("text_%d" % seed, sd), te, table_fp8.to(torch.float32)


def case_text_encoder():
    """Text encoders through load_clip: legacy scaled_fp8 and unscaled fp8 files."""
    result = {"ok": True}
    tokens = torch.tensor([[3, 1, 4, 1, 5, 9]])
    for kind, scaled in (("scaled", True), ("unscaled", False)):
        path, te, table = text_file(10 + scaled, scaled)
        clip = loaders().load_clip([path])
        out = clip.encode(tokens).float().cpu()
        result[kind + "_cos"] = cosine(out, text_reference({n: v[2] for n, v in te.items()}, table, tokens))
        result[kind + "_device"] = str(clip.patcher.load_device)
        result[kind + "_weights"] = device_summary(clip.cond_stage_model)["weights"]
    result["cos"] = min(result["scaled_cos"], result["unscaled_cos"])
    return result


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
    out = layer(x.to(ACTIVATIONS).to(DEVICE)).float().cpu()
    scale = layer.weight._params.scale
    where = "%s@%s" % (str(scale.dtype).replace("torch.", ""), scale.device.type)
    return {"ok": True, "cos": cosine(out, x @ reference.T), "s_rel": where, **device_summary(layer)}


def case_lora():
    """A LoRA on a comfy_quant float8 layer, patched at load as ComfyUI does."""
    path, layers, biases, norm = comfy_quant_file(30)
    generator = torch.Generator().manual_seed(31)
    up, down = torch.randn(WIDTH, 8, generator=generator) * 0.1, torch.randn(8, WIDTH, generator=generator) * 0.1
    patcher = loaders().load_diffusion_model(path).clone()
    added = patcher.add_patches({"blocks.0.weight": (up, down)}, 0.8)
    result = run_diffusion(patcher, layers, biases, norm, extra_weights={"blocks.0": 0.8 * (up @ down)})
    result["patched"] = added
    without = run_diffusion(loaders().load_diffusion_model(path), layers, biases, norm,
                            extra_weights={"blocks.0": 0.8 * (up @ down)})
    result["cos_without_lora"] = without["cos"]
    return result


def bf16_diffusion_file():
    layers, biases, norm = diffusion_parts(40)
    exact = {n: (None, None, v[2].to(torch.bfloat16).float()) for n, v in layers.items()}
    sd = {name + ".weight": v[2].to(torch.bfloat16) for name, v in exact.items()}
    sd.update({name + ".bias": b for name, b in biases.items()}, norm_weight=norm)
    return save("bf16_diffusion", sd), exact, biases, norm


def case_weight_dtype_option():
    """The Load Diffusion Model node's weight_dtype fp8_e4m3fn on a bf16 file."""
    path, layers, biases, norm = bf16_diffusion_file()
    patcher = loaders().load_diffusion_model(path, model_options={"dtype": torch.float8_e4m3fn})
    return run_diffusion(patcher, layers, biases, norm)


def case_flags():
    """bf16 files under the command line's --fp8_* flags (the caller passes them)."""
    path, layers, biases, norm = bf16_diffusion_file()
    result = run_diffusion(loaders().load_diffusion_model(path), layers, biases, norm)
    te_layers = fp8_layers(TE_LAYERS, 41)
    table = torch.randn(VOCAB, WIDTH, generator=torch.Generator().manual_seed(42)).to(torch.bfloat16)
    sd = {"shared.weight": table, **{n + ".weight": v[2].to(torch.bfloat16) for n, v in te_layers.items()}}
    clip = loaders().load_clip([save("bf16_text", sd)])
    tokens = torch.tensor([[2, 7, 1, 8]])
    out = clip.encode(tokens).float().cpu()
    weights = {n: v[2].to(torch.bfloat16).float() for n, v in te_layers.items()}
    result["text_cos"] = cosine(out, text_reference(weights, table.float(), tokens))
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
        import ascend_shim.engine as engine
    except ImportError:
        return None
    if not engine.started():
        return None
    return {r["name"]: {"state": r["state"], "reason": r.get("reason")}
            for r in engine.patch_status() if r["name"].startswith("fp8_")}


wanted = [c for c in os.environ.get("FP8_CASES", ",".join(CASES)).split(",") if c]
with torch.no_grad():  # ComfyUI loads outside inference mode
    results = {name: run(name) for name in wanted}
print(json.dumps({"device": str(DEVICE), "cases": results, "status": fp8_status()}))
