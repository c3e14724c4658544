"""Fake ``comfy.sd`` (shape v0_30): ComfyUI 0.30's loaders, on two tiny models.

The call sequence is ComfyUI 0.30's; only the models are small:

- ``load_diffusion_model(path, model_options)`` -> ``load_torch_file(...,
  return_metadata=True)`` -> ``load_diffusion_model_state_dict``: without
  ``custom_operations``, ``convert_old_quants`` (before and after the prefix is
  stripped); ``model_options["dtype"]`` (the Load Diffusion Model node's
  ``weight_dtype``) else ``unet_dtype(model_params, supported_dtypes,
  weight_dtype)`` (``weight_dtype`` None for a quantized model);
  ``unet_manual_cast``; ``pick_operations(..., model_config)``; weights loaded
  into a model built on the CPU; a ``ModelPatcher`` moves it.
- ``load_checkpoint_guess_config(path)`` -> ``load_state_dict_guess_config``:
  ``weight_dtype`` is read *before* ``convert_old_quants(sd, diffusion
  prefix)``; the text encoder's legacy ``scaled_fp8`` prefixes are converted
  one by one; the text encoder is built from its prefix.
- ``load_clip(paths)`` -> ``load_torch_file`` + ``convert_old_quants`` ->
  ``load_text_encoder_state_dicts`` -> ``CLIP``: dtype from ``model_options``
  else ``text_encoder_dtype(load_device)``; the encoder keeps a file's fp8 as
  ``pick_weight_dtype`` allows; every dtype the encoder holds must pass
  ``supports_cast(load_device, dtype)`` or the encoder moves to the offload
  device ("Had to shift TE back.").

``TinyDiffusionModel`` (``proj_in``/``blocks.N``/``proj_out`` Linears and a
plain ``norm_weight`` parameter) and ``TinyTextEncoder`` (an Embedding
``shared`` and ``blocks.N`` Linears, computing in float32 as ComfyUI's
encoders do) stand for a DiT and a T5.
"""
import logging
import types

import torch

import comfy.model_management as model_management
import comfy.model_patcher
import comfy.ops
import comfy.utils

DIFFUSION_PREFIX = "model.diffusion_model."
TEXT_ENCODER_PREFIX = "text_encoders.tiny."
DIFFUSION_DTYPES = [torch.bfloat16, torch.float16, torch.float32]


class TinyDiffusionModel(torch.nn.Module):
    def __init__(self, in_features, width, depth, dtype=None, device=None, operations=None):
        super().__init__()
        self.proj_in = operations.Linear(in_features, width, dtype=dtype, device=device)
        self.blocks = torch.nn.ModuleList(operations.Linear(width, width, dtype=dtype, device=device)
                                          for _ in range(depth))
        self.norm_weight = torch.nn.Parameter(torch.empty(width, dtype=dtype, device=device), requires_grad=False)
        self.proj_out = operations.Linear(width, in_features, dtype=dtype, device=device)

    def forward(self, x):
        x = self.proj_in(x)
        for block in self.blocks:
            x = x + torch.nn.functional.gelu(block(x))
        x = x * comfy.model_management.cast_to(self.norm_weight, x.dtype, x.device)
        return self.proj_out(x)


class EmbeddingTable(torch.nn.Module):
    def __init__(self, vocab, width, dtype=None, device=None):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.empty(vocab, width, dtype=dtype, device=device), requires_grad=False)


class TinyTextEncoder(torch.nn.Module):
    def __init__(self, vocab, width, depth, dtype=None, device=None, operations=None):
        super().__init__()
        self.shared = EmbeddingTable(vocab, width, dtype=dtype, device=device)
        self.blocks = torch.nn.ModuleList(operations.Linear(width, width, bias=False, dtype=dtype, device=device)
                                          for _ in range(depth))
        self.dtypes = {dtype}

    def forward(self, tokens):
        table = comfy.model_management.cast_to(self.shared.weight, torch.float32, tokens.device)
        x = torch.nn.functional.embedding(tokens, table)
        for block in self.blocks:
            x = x + torch.nn.functional.gelu(block(x))
        return x


def _depth(sd, prefix):
    start = prefix + "blocks."
    return len({k[len(start):].split(".")[0] for k in sd if k.startswith(start) and k.endswith(".weight")})


def unet_prefix_from_state_dict(sd):
    return DIFFUSION_PREFIX if any(k.startswith(DIFFUSION_PREFIX) for k in sd) else ""


def detect_diffusion_model(sd, prefix=""):
    weight = sd.get(prefix + "proj_in.weight")
    if weight is None:
        return None
    return {"in_features": weight.shape[1], "width": weight.shape[0], "depth": _depth(sd, prefix)}


def detect_text_encoder(sd, prefix=""):
    weight = sd.get(prefix + "shared.weight")
    if weight is None:
        return None
    return {"vocab": weight.shape[0], "width": weight.shape[1], "depth": _depth(sd, prefix)}


def _build_diffusion_model(config, sd, unet_dtype, manual_cast_dtype, load_device, quant_config, custom_operations):
    model_config = types.SimpleNamespace(quant_config=quant_config)
    operations = custom_operations or comfy.ops.pick_operations(unet_dtype, manual_cast_dtype, load_device,
                                                                model_config=model_config)
    model = TinyDiffusionModel(**config, dtype=unet_dtype, device=torch.device("cpu"), operations=operations)
    model.load_state_dict(sd, strict=False)
    return comfy.model_patcher.ModelPatcher(model, load_device, model_management.unet_offload_device())


def load_diffusion_model_state_dict(sd, model_options={}, metadata=None):
    dtype = model_options.get("dtype", None)
    custom_operations = model_options.get("custom_operations", None)
    if custom_operations is None:
        sd, metadata = comfy.utils.convert_old_quants(sd, "", metadata=metadata)
    prefix = unet_prefix_from_state_dict(sd)
    stripped = comfy.utils.state_dict_prefix_replace(sd, {prefix: ""}, filter_keys=True) if prefix else {}
    if len(stripped) > 0:
        sd = stripped
        if custom_operations is None:
            sd, metadata = comfy.utils.convert_old_quants(sd, "", metadata=metadata)
    parameters = comfy.utils.calculate_parameters(sd)
    weight_dtype = comfy.utils.weight_dtype(sd)
    load_device = model_options.get("load_device", model_management.get_torch_device())
    config = detect_diffusion_model(sd)
    if config is None:
        return None
    quant_config = comfy.utils.detect_layer_quantization(sd, "")
    if quant_config is not None:
        weight_dtype = None
    unet_dtype = dtype if dtype is not None else model_management.unet_dtype(
        model_params=parameters, supported_dtypes=DIFFUSION_DTYPES, weight_dtype=weight_dtype)
    manual_cast_dtype = model_management.unet_manual_cast(None if quant_config else unet_dtype, load_device,
                                                          DIFFUSION_DTYPES)
    return _build_diffusion_model(config, sd, unet_dtype, manual_cast_dtype, load_device, quant_config,
                                  custom_operations)


def load_diffusion_model(unet_path, model_options={}):
    sd, metadata = comfy.utils.load_torch_file(unet_path, return_metadata=True)
    model = load_diffusion_model_state_dict(sd, model_options=model_options, metadata=metadata)
    if model is None:
        raise RuntimeError("ERROR: Could not detect model type of: {}".format(unet_path))
    return model


class CLIP:
    def __init__(self, config, state_dict, model_options={}):
        load_device = model_options.get("load_device", model_management.text_encoder_device())
        offload_device = model_options.get("offload_device", model_management.text_encoder_offload_device())
        dtype = model_options.get("dtype", None)
        if dtype is None:
            dtype = model_management.text_encoder_dtype(load_device)
        quant_config = comfy.utils.detect_layer_quantization(state_dict, "")
        if quant_config is not None:
            operations = comfy.ops.mixed_precision_ops(quant_config, dtype)
        else:  # the file's own dtype where it is smaller, as the encoders ask pick_weight_dtype
            dtype = model_management.pick_weight_dtype(state_dict["shared.weight"].dtype, dtype, load_device)
            operations = comfy.ops.manual_cast
        self.cond_stage_model = TinyTextEncoder(**config, dtype=dtype, device=offload_device, operations=operations)
        for dt in self.cond_stage_model.dtypes:
            if not model_management.supports_cast(load_device, dt):
                load_device = offload_device
                logging.warning("Had to shift TE back.")
        self.cond_stage_model.load_state_dict(state_dict, strict=False)
        self.patcher = comfy.model_patcher.ModelPatcher(self.cond_stage_model, load_device, offload_device)
        self.load_device = load_device

    def encode(self, tokens):
        model_management.load_models_gpu([self.patcher])
        return self.cond_stage_model(tokens.to(self.patcher.load_device))


def load_text_encoder_state_dicts(state_dicts=[], embedding_directory=None, model_options={}):
    config = detect_text_encoder(state_dicts[0])
    if config is None:
        raise RuntimeError("ERROR: no text encoder in this state dict")
    return CLIP(config, state_dicts[0], model_options=model_options)


def load_clip(ckpt_paths, embedding_directory=None, model_options={}):
    clip_data = []
    for path in ckpt_paths:
        sd, metadata = comfy.utils.load_torch_file(path, safe_load=True, return_metadata=True)
        if model_options.get("custom_operations", None) is None:
            sd, metadata = comfy.utils.convert_old_quants(sd, model_prefix="", metadata=metadata)
        clip_data.append(sd)
    return load_text_encoder_state_dicts(clip_data, embedding_directory=embedding_directory,
                                         model_options=model_options)


def load_state_dict_guess_config(sd, output_clip=True, model_options={}, te_model_options={}, metadata=None):
    prefix = unet_prefix_from_state_dict(sd)
    parameters = comfy.utils.calculate_parameters(sd, prefix)
    weight_dtype = comfy.utils.weight_dtype(sd, prefix)
    load_device = model_options.get("load_device", model_management.get_torch_device())
    custom_operations = model_options.get("custom_operations", None)
    if custom_operations is None:
        sd, metadata = comfy.utils.convert_old_quants(sd, prefix, metadata=metadata)
    config = detect_diffusion_model(sd, prefix)
    if config is None:
        return None
    quant_config = comfy.utils.detect_layer_quantization(sd, prefix)
    if quant_config is not None:
        weight_dtype = None
    unet_dtype = model_options.get("dtype", None) or model_management.unet_dtype(
        model_params=parameters, supported_dtypes=DIFFUSION_DTYPES, weight_dtype=weight_dtype)
    manual_cast_dtype = model_management.unet_manual_cast(None if quant_config else unet_dtype, load_device,
                                                          DIFFUSION_DTYPES)
    unet_sd = comfy.utils.state_dict_prefix_replace(sd, {prefix: ""}, filter_keys=True)
    model = _build_diffusion_model(config, unet_sd, unet_dtype, manual_cast_dtype, load_device, quant_config,
                                   custom_operations)
    clip = None
    if output_clip:
        if te_model_options.get("custom_operations", None) is None:
            for marker in [k for k in sd if k.endswith(".scaled_fp8")]:
                sd, _ = comfy.utils.convert_old_quants(sd, marker[:-len("scaled_fp8")], metadata={})
        clip_sd = comfy.utils.state_dict_prefix_replace(sd, {TEXT_ENCODER_PREFIX: ""}, filter_keys=True)
        te_config = detect_text_encoder(clip_sd)
        if te_config is not None:
            clip = CLIP(te_config, clip_sd, model_options=te_model_options)
    return model, clip


def load_checkpoint_guess_config(ckpt_path, output_clip=True, model_options={}, te_model_options={}):
    sd, metadata = comfy.utils.load_torch_file(ckpt_path, return_metadata=True)
    out = load_state_dict_guess_config(sd, output_clip, model_options, te_model_options, metadata=metadata)
    if out is None:
        raise RuntimeError("ERROR: Could not detect model type of: {}".format(ckpt_path))
    return out
