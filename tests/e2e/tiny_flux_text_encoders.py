"""Flux's two text encoders, tiny: CLIP-L and T5-XXL at the tiny Flux DiT's widths.

ComfyUI 0.30.0 loads them with ``comfy.sd.load_clip([clip_l, t5xxl],
clip_type=CLIPType.FLUX)`` (the DualCLIPLoader node) and sizes each from a
JSON config that ``model_options["clip_l_model_config"]`` /
``["t5xxl_model_config"]`` override key by key: ComfyUI's own option, so no
class is swapped here. The structure stays (CLIP-L's 12 layers, 77 positions
and vocabulary; T5-XXL's 24 gated-GELU layers, relative attention buckets and
vocabulary), the widths shrink to what the tiny DiT takes: T5's width is the
DiT's ``context_in_dim`` (4096 in Flux.1), CLIP-L's pooled width its
``vec_in_dim`` (768). The files hold each encoder's own keys
(``text_model.*``; ``encoder.block.N.*``, ``shared.weight``), as
``clip_l.safetensors`` and ``t5xxl_fp16.safetensors`` do.
"""

from __future__ import annotations

import torch

from tiny_models import FluxSpec, _fill

PROMPT = "a lighthouse on a cliff at dusk, waves below, oil painting"

CLIP_L = {"hidden_size": FluxSpec.config["vec_in_dim"], "intermediate_size": 4 * FluxSpec.config["vec_in_dim"],
          "num_attention_heads": 2, "projection_dim": FluxSpec.config["vec_in_dim"]}
T5XXL = {"d_model": FluxSpec.config["context_in_dim"], "d_ff": 160, "d_kv": 32, "num_heads": 2}


def model_options() -> dict:
    return {"model_config": dict(CLIP_L), "t5xxl_model_config": dict(T5XXL)}  # load_clip writes into the first


def _config(path_name: str, override: dict) -> dict:
    import json
    import os

    import comfy.sd1_clip

    with open(os.path.join(os.path.dirname(comfy.sd1_clip.__file__), path_name)) as f:
        return {**json.load(f), **override}


def state_dicts(seed: int = 5) -> tuple[dict, dict]:
    """Seeded fp32 weights of (CLIP-L, T5-XXL) in their on-disk layouts."""
    import comfy.clip_model
    import comfy.ops
    import comfy.text_encoders.t5

    ops = comfy.ops.disable_weight_init
    with torch.device("meta"):
        clip_l = comfy.clip_model.CLIPTextModel(_config("sd1_clip_config.json", CLIP_L), torch.float32, "meta", ops)
        t5 = comfy.text_encoders.t5.T5(_config("text_encoders/t5_config_xxl.json", T5XXL), torch.float32, "meta", ops)
    t5_weights = _fill(t5, seed + 1, lambda key: False)
    # T5 does not scale its attention logits: its own initializer scales the query by
    # 1/sqrt(d_kv) instead (HF T5PreTrainedModel._init_weights). Without it a random T5's
    # softmax is nearly one-hot and bf16 rounding flips it (cosine 0.97 against fp32).
    for key in t5_weights:
        if key.endswith(".SelfAttention.q.weight"):
            t5_weights[key] = t5_weights[key] / T5XXL["d_kv"] ** 0.5
    return _fill(clip_l, seed, lambda key: False), t5_weights


def encode(clip) -> tuple:
    """(positive, negative) as CLIPTextEncode makes them, with FluxGuidance's guidance 3.5 set."""
    import node_helpers

    positive = clip.encode_from_tokens_scheduled(clip.tokenize(PROMPT))
    negative = clip.encode_from_tokens_scheduled(clip.tokenize(""))
    return (node_helpers.conditioning_set_values(positive, {"guidance": 3.5}),
            node_helpers.conditioning_set_values(negative, {"guidance": 3.5}))
