"""MiniMax-H3's text encoder, tiny: ComfyUI's own Qwen3-VL-32B encoder class at the tiny DiT's text width.

ComfyUI 0.30.0 loads MiniMax-H3's encoder with ``comfy.sd.load_clip(...,
clip_type=CLIPType.MINIMAX)``: ``detect_te_model`` names it ``QWEN3VL_32B``
when the file has ``visual.deepstack_merger_list.0.norm.weight`` and
``model.layers.49.self_attn.q_proj.weight``, and ``comfy.text_encoders.minimax``
builds it (``MiniMaxQwen3VL``, ``MiniMaxH3Tokenizer``). Here: the config swap
that makes that class tiny, its seeded weights in the on-disk layout, the
prompts as CLIPTextEncode encodes them, and what the loaded encoder holds.
"""

from __future__ import annotations

import math

import torch

from tiny_models import MiniMaxH3Spec, _fill

PROMPT = "a red fox runs through fresh snow at dawn, the camera follows it"

TEXT_ENCODER = "qwen3vl_32b"  # ComfyUI's name for MiniMax-H3's encoder (Qwen3-VL-32B, 50 LM layers)


def model_qwen3vl_32b_at_tiny_width(width: int = MiniMaxH3Spec.config["text_dim"]) -> None:
    """Shrink ComfyUI's Qwen3-VL-32B config tables, in this interpreter's module objects, to ``width``.

    Models the 32B encoder's *structure* at a tiny width: its 50 LM layers,
    grouped-query attention with q/k norms and head_dim != hidden/heads, the
    interleaved mRoPE sections in the 32B's proportions, no final norm and no
    lm_head, the real vocabulary (the real tokenizer's ids stay in range), and a
    DeepStack vision tower with its mergers (which ComfyUI's detection looks
    for). Its real weights (~64 GB) are out of reach of a test. ComfyUI builds
    the encoder from fixed tables (``QWEN3VL_CONFIGS`` and ``QWEN3VL_VISION`` in
    ``comfy.text_encoders.qwen3vl``) with no size argument, so this test code
    swaps those two entries; product code is not involved. Call it before
    ``comfy.sd.load_clip`` (and before ``state_dict``).
    """
    import dataclasses

    import comfy.text_encoders.qwen3vl as qwen3vl

    current = qwen3vl.QWEN3VL_CONFIGS[TEXT_ENCODER]
    if getattr(current, "tiny_width", None) == width:
        return
    full = getattr(current, "full_config", current)

    @dataclasses.dataclass
    class TinyQwen3VL_32BConfig(full):
        hidden_size: int = width
        intermediate_size: int = 5 * width  # 25600 / 5120
        num_attention_heads: int = 4
        num_key_value_heads: int = 1  # grouped-query attention, as the 32B's 64 / 8
        head_dim = 32  # q_proj widens to heads * head_dim (64 * 128 = 8192 at 5120)
        rope_dims = [6, 5, 5]  # the 32B's [24, 20, 20] for head_dim 128
        tiny_width = width
        full_config = full

    qwen3vl.QWEN3VL_CONFIGS[TEXT_ENCODER] = TinyQwen3VL_32BConfig
    # 27 blocks with DeepStack taps after 8, 16 and 24 -> 3 blocks, a tap after each
    qwen3vl.QWEN3VL_VISION[TEXT_ENCODER] = dict(hidden_size=width, intermediate_size=2 * width, depth=3,
                                                deepstack_visual_indexes=[0, 1, 2])


def state_dict(seed: int = 3) -> dict:
    """Seeded fp32 weights of MiniMax-H3's text encoder in its on-disk layout
    (``model.layers.N.*``, ``model.embed_tokens.weight``, ``visual.*``), built
    from ComfyUI's own class at the width ``model_qwen3vl_32b_at_tiny_width`` set."""
    import comfy.ops
    import comfy.text_encoders.minimax

    with torch.device("meta"):
        encoder = comfy.text_encoders.minimax.MiniMaxQwen3VL({}, torch.float32, "meta",
                                                              comfy.ops.disable_weight_init)
    if getattr(encoder.model.config, "tiny_width", None) is None:
        raise RuntimeError("call model_qwen3vl_32b_at_tiny_width() first: this is the full 32B config")
    out = _fill(encoder, seed, lambda key: False)
    # token embeddings of unit scale per entry, as trained embeddings are (not 1/sqrt(width))
    out["model.embed_tokens.weight"] *= math.sqrt(out["model.embed_tokens.weight"].shape[1])
    return out


def write(path: str, dtype_name: str) -> None:
    """The checkpoint a user would load, its weights in ``dtype_name`` (bf16 as shipped, fp32 for the reference)."""
    import safetensors.torch

    dtype = {"bf16": torch.bfloat16, "fp32": torch.float32}[dtype_name]
    safetensors.torch.save_file({k: t.to(dtype).contiguous() for k, t in state_dict().items()}, path)


def encode(clip) -> tuple:
    """(positive, negative) conditioning, as the CLIPTextEncode node makes it (prompt, empty prompt)."""
    return (clip.encode_from_tokens_scheduled(clip.tokenize(PROMPT)),
            clip.encode_from_tokens_scheduled(clip.tokenize("")))


def describe(clip, path: str) -> dict:
    """What ComfyUI built from the file at ``path``, and whether every weight of the file sits in it."""
    import comfy.sd
    import comfy.utils

    inner = clip.cond_stage_model.qwen3vl_32b  # MiniMaxH3ClipModel; .transformer is the encoder
    on_disk = comfy.utils.load_torch_file(path, safe_load=True)
    loaded = inner.transformer.state_dict()
    return {
        "te_model": comfy.sd.detect_te_model(on_disk).name,
        "classes": [type(clip.cond_stage_model).__mro__[1].__name__, type(inner).__name__,
                    type(inner.transformer).__name__],
        "lm_layers": inner.transformer.num_layers,
        "width": inner.transformer.model.config.hidden_size,
        "tokens": len(clip.tokenize(PROMPT)[TEXT_ENCODER][0]),
        "missing": sorted(set(loaded) - set(on_disk)),
        "unexpected": sorted(set(on_disk) - set(loaded)),
        "differing": sorted(k for k in set(loaded) & set(on_disk) if not torch.equal(loaded[k].cpu(), on_disk[k])),
        "weights": len(on_disk),
        "parameters": sum(t.numel() for t in on_disk.values()),
        "weight_dtypes": sorted({str(t.dtype) for t in loaded.values()}),
        "load_device": str(clip.patcher.load_device),
    }
