"""Tiny, seeded, random checkpoints of real architectures, in ComfyUI 0.30's on-disk format.

Each spec builds the architecture with ComfyUI's own class (so the keys and
shapes are the real ones) at a depth and width that samples in seconds, fills
it from a seeded generator, and says which layers a quantized file quantizes.
``checkpoint(master, spec, variant)`` writes the weights the way 0.30 stores
them: the quantized weight, its scales under the names ``comfy/ops.py`` pops
(``weight_scale``; ``weight_s_rel``/``weight_s_channel``/``weight_codebook`` for
W4A8), and a per-layer ``comfy_quant`` JSON tensor; the quantizing is done by
comfy-kitchen's own layouts (``QuantizedTensor.from_float``).

Random weights at full scale make a DiT unstable (bf16 against fp32 drifts by
percents of cosine): the modulation (adaLN) weights and biases are scaled down
by ``MOD_SCALE`` (the gates keep a bias of 1, see ``_fill``). Measured on the
tiny Flux, one forward in bf16 against fp32 on the CPU: 1 - cosine 1.0e-3 at
0.1, 1.2e-4 at 0.03, 4.0e-5 at 0.01 (a 2% change of one block linear moves
it by 2.9e-5); the test checks the sampled result (bf16 compute on the NPU
against fp32 on the CPU).
"""

from __future__ import annotations

import json
import math

import torch

MOD_SCALE = 0.01


def flat(t) -> torch.Tensor:
    """One CPU fp32 vector of a latent: a tensor, a nested tensor (MiniMax-H3's video + audio) or a list."""
    if getattr(t, "is_nested", False):
        t = t.unbind()
    if isinstance(t, (list, tuple)):
        return torch.cat([flat(x) for x in t])
    return t.detach().float().cpu().flatten()


def _comfy_quant(conf: dict) -> torch.Tensor:
    return torch.tensor(list(json.dumps(conf).encode("utf-8")), dtype=torch.uint8)


def _fill(module: torch.nn.Module, seed: int, is_modulation, hidden: int = 0) -> dict:
    """Seeded values for every parameter and buffer of ``module`` (fp32, CPU).

    The blocks' modulation biases hold (shift, scale, gate) chunks of ``hidden``
    each: the gates get 1 + a small random part, so the blocks (where the
    quantized layers are) carry the output rather than a gate of ~0 muting them.
    """
    gen = torch.Generator().manual_seed(seed)
    out = {}
    for key, t in sorted(module.state_dict().items()):
        shape = tuple(t.shape)
        if len(shape) >= 2:
            fan_in = math.prod(shape[1:])
            value = torch.randn(shape, generator=gen) / math.sqrt(fan_in)
        elif key.endswith("bias"):
            value = torch.randn(shape, generator=gen) * 0.02
        else:  # norm scales
            value = 1.0 + torch.randn(shape, generator=gen) * 0.02
        if is_modulation(key):
            value = value * MOD_SCALE
            if hidden and key.endswith("bias") and not key.startswith("final_layer."):
                value.view(-1, 3, hidden)[:, 2, :] += 1.0  # the gate
        out[key] = value.float().contiguous()
    return out


class FluxSpec:
    """Flux.1-dev layout (guidance embedding, CLIP pooled vector, T5 context)."""

    name = "flux"
    config = dict(image_model="flux", in_channels=16, out_channels=16, vec_in_dim=32, context_in_dim=64,
                  hidden_size=256, mlp_ratio=4.0, num_heads=2, depth=1, depth_single_blocks=2,
                  axes_dim=[16, 56, 56], theta=10000, patch_size=2, qkv_bias=True, guidance_embed=True,
                  txt_ids_dims=[])

    def __init__(self, seed: int = 0):
        self.seed = seed

    def build(self) -> dict:
        import comfy.ldm.flux.model
        import comfy.ops

        with torch.device("meta"):
            model = comfy.ldm.flux.model.Flux(dtype=torch.float32, operations=comfy.ops.disable_weight_init,
                                              **self.config)
        return _fill(model, self.seed, self.is_modulation, self.config["hidden_size"])

    @staticmethod
    def is_modulation(key: str) -> bool:
        return "_mod." in key or ".modulation." in key or "adaLN_modulation" in key

    def quantized(self, key: str, t: torch.Tensor) -> bool:
        """The block linears, as quantized Flux files have them (modulation stays high precision)."""
        return (key.endswith(".weight") and t.dim() == 2 and key.startswith(("double_blocks.", "single_blocks."))
                and not self.is_modulation(key))

    def latent(self) -> torch.Tensor:
        return torch.zeros(1, 16, 16, 16)

    def conditioning(self, seed: int):
        gen = torch.Generator().manual_seed(seed + 100)
        cond = torch.randn(1, 8, self.config["context_in_dim"], generator=gen)
        pooled = torch.randn(1, self.config["vec_in_dim"], generator=gen)
        positive = [[cond, {"pooled_output": pooled, "guidance": 3.5}]]
        negative = [[torch.zeros_like(cond), {"pooled_output": torch.zeros_like(pooled), "guidance": 3.5}]]
        return positive, negative


class MiniMaxH3Spec:
    """MiniMax-H3 (text to video+audio), the seed user's model: its attention calls
    comfy-kitchen's ``rms_rope_split_half_`` on the packed qkv buffer."""

    name = "minimax"
    config = dict(hidden_size=256, num_layers=2, token_refiner_num_layers=1, num_attention_heads=2,
                  attention_head_dim=128, ffn_hidden_size=512, latents_dim=24, audio_latents_dim=32,
                  text_dim=64, timestep_input_dim=256, time_embed_hidden_size=256, time_embed_dim=128,
                  rope_inv_freq_len=16)

    def __init__(self, seed: int = 0, heads: int = 2, av=(128, 128, 5), text_tokens: int = 12, head_dim: int = 128):
        """``heads`` attention heads of ``head_dim`` (MiniMax-H3's real head size, 128, by default): the
        width grows with them (sequence parallel splits the heads among the cards: Ulysses 4 needs 4).
        ``av``: the EmptyMiniMaxH3LatentAV node's width, height and length; ``text_tokens``: the prompt's."""
        self.seed = seed
        self.av, self.text_tokens = tuple(av), text_tokens
        if heads != 2 or head_dim != 128:
            self.config = dict(self.config, num_attention_heads=heads, attention_head_dim=head_dim,
                               hidden_size=head_dim * heads, ffn_hidden_size=2 * head_dim * heads,
                               rope_inv_freq_len=head_dim // 8)  # rope on 3/4 of each head, as at 128

    def build(self) -> dict:
        import comfy.ldm.minimax.model
        import comfy.ops

        with torch.device("meta"):
            model = comfy.ldm.minimax.model.MiniMaxH3Model(dtype=torch.float32,
                                                           operations=comfy.ops.disable_weight_init, **self.config)
        out = _fill(model, self.seed, self.is_modulation, self.config["hidden_size"])
        # rope frequencies are a fixed table, not a learned weight (16 per axis)
        count = self.config["rope_inv_freq_len"]
        out["rope.inv_freq"] = 1.0 / (10000.0 ** (torch.arange(count, dtype=torch.float32) / count))
        return out

    @staticmethod
    def is_modulation(key: str) -> bool:
        return "adaln_proj." in key

    def quantized(self, key: str, t: torch.Tensor) -> bool:
        """The DiT blocks' attention and MLP linears."""
        return (key.endswith(".weight") and t.dim() == 2 and key.startswith("blocks.")
                and (".attn." in key or ".mlp." in key))

    def latent(self):
        from comfy_extras.nodes_minimax_h3 import _empty_av_latent

        latent, _ = _empty_av_latent(*self.av)  # the EmptyMiniMaxH3LatentAV node's latent
        return latent["samples"]

    def conditioning(self, seed: int):
        # random text states of the Qwen3-VL encoder's shape (its 32B weights are out of reach)
        gen = torch.Generator().manual_seed(seed + 100)
        cond = torch.randn(1, self.text_tokens, self.config["text_dim"], generator=gen)
        return [[cond, {}]], [[torch.zeros_like(cond), {}]]


class Wan21Spec:
    """Wan 2.1 text-to-video, the DiT raylight users run most: self-attention, cross-attention
    to the umT5 text states (4096 wide: ComfyUI's detection reads no text width) and an FFN per
    block. ComfyUI detects ``dim // 128`` heads."""

    name = "wan"

    def __init__(self, seed: int = 0, heads: int = 2, frames=(2, 8, 8)):
        """``frames``: the latent's frames, height and width (5 frames of 64x64 by default)."""
        self.seed = seed
        self.frames = tuple(frames)
        self.config = dict(model_type="t2v", patch_size=(1, 2, 2), in_dim=16, dim=128 * heads, ffn_dim=256 * heads,
                           freq_dim=256, text_dim=4096, out_dim=16, num_heads=heads, num_layers=2)

    def build(self) -> dict:
        import comfy.ldm.wan.model
        import comfy.ops

        with torch.device("meta"):
            model = comfy.ldm.wan.model.WanModel(dtype=torch.float32, operations=comfy.ops.disable_weight_init,
                                                 **self.config)
        return _fill(model, self.seed, self.is_modulation)

    @staticmethod
    def is_modulation(key: str) -> bool:
        return "modulation" in key or key.startswith("time_projection.")

    def quantized(self, key: str, t: torch.Tensor) -> bool:
        """The blocks' attention and FFN linears."""
        return (key.endswith(".weight") and t.dim() == 2 and key.startswith("blocks.")
                and (".self_attn." in key or ".cross_attn." in key or ".ffn." in key))

    def latent(self) -> torch.Tensor:
        return torch.zeros(1, 16, *self.frames)  # in Wan's VAE latent: 4 (t - 1) + 1 frames of 8h x 8w

    def conditioning(self, seed: int):
        gen = torch.Generator().manual_seed(seed + 100)
        cond = torch.randn(1, 12, self.config["text_dim"], generator=gen) * 0.1
        return [[cond, {}]], [[torch.zeros_like(cond), {}]]


SPECS = {"flux": FluxSpec, "minimax": MiniMaxH3Spec, "wan": Wan21Spec}


def _quantize(weight: torch.Tensor, variant: str, codebook: bool = False) -> tuple[dict, dict]:
    """{suffix: tensor} and the comfy_quant conf of one weight, by comfy-kitchen's layouts."""
    from comfy_kitchen.tensor import QuantizedTensor, get_layout_class

    w = weight.to(torch.bfloat16)
    if variant == "int8":
        q = QuantizedTensor.from_float(w, "TensorWiseINT8Layout")
        return {"weight": q._qdata, "weight_scale": q._params.scale.float()}, {"format": "int8_tensorwise"}
    if variant == "fp8":
        q = QuantizedTensor.from_float(w, "TensorCoreFP8E4M3Layout")
        return {"weight": q._qdata, "weight_scale": q._params.scale.float()}, {"format": "float8_e4m3fn"}
    if variant == "w4a8":
        layout = "AsymW4A8Int8Layout"
        # a Lloyd-Max codebook takes seconds to fit on the CPU: one layer has one
        q = QuantizedTensor.from_float(w, layout, group_size=16, convrot_groupsize=256, codebook=codebook)
        parts = get_layout_class(layout).state_dict_tensors(q._qdata, q._params)
        tensors = {"weight" + suffix: t for suffix, t in parts.items()}
        # fp8 group scales (weight_s_rel), as the files hold them
        return tensors, {"format": "asym_w4a8_int8", "group_size": 16, "convrot_groupsize": 256}
    raise ValueError(variant)


def checkpoint(master: dict, spec, variant: str) -> dict:
    """The state dict of one variant: bf16, or bf16 with quantized block linears."""
    out = {}
    first = True
    for key, t in sorted(master.items()):
        if variant != "bf16" and spec.quantized(key, t):
            layer = key[: -len(".weight")]
            tensors, conf = _quantize(t, variant, codebook=first)
            first = False
            for suffix, value in tensors.items():
                out["%s.%s" % (layer, suffix)] = value.contiguous()
            out[layer + ".comfy_quant"] = _comfy_quant(conf)
        else:
            out[key] = t.to(torch.bfloat16).contiguous()
    return out


def lora_for(master: dict, spec, seed: int, rank: int = 4) -> dict:
    """A LoRA (lora_up/lora_down/alpha) on every quantized linear, seeded."""
    gen = torch.Generator().manual_seed(seed)
    lora = {}
    for key, t in sorted(master.items()):
        if spec.quantized(key, t):
            base = "diffusion_model." + key[: -len(".weight")]
            out_features, in_features = t.shape
            lora[base + ".lora_down.weight"] = torch.randn(rank, in_features, generator=gen) / math.sqrt(in_features)
            lora[base + ".lora_up.weight"] = torch.randn(out_features, rank, generator=gen) * 0.5
            lora[base + ".alpha"] = torch.tensor(float(rank))
    return lora


class ZImageSpec:
    """Z-Image (Lumina 2's NextDiT with Z-Image's modulation), the PR's model: its attention calls
    comfy-kitchen's ``ck.rms_rope`` (q/k RMSNorm + RoPE, equal q and kv heads).

    ComfyUI's detection gives Z-Image's settings only at its real width (``dim`` 3840, 30 heads):
    ``model_z_image_at_tiny_width`` makes ComfyUI, in this interpreter, take the tiny width for
    Z-Image (its detection fills Z-Image's settings at 2 heads of the real head size 128, and
    ``supported_models.ZImage`` matches that width), as ``tiny_text_encoder`` does for the encoder.
    Test code only.
    """

    name = "zimage"
    width = 256
    z_image = dict(n_heads=2, n_kv_heads=2, axes_dims=[32, 48, 48], axes_lens=[1536, 512, 512], rope_theta=256.0,
                   ffn_dim_multiplier=8.0 / 3.0, z_image_modulation=True, time_scale=1000.0, pad_tokens_multiple=32)
    config = dict(image_model="lumina2", patch_size=2, in_channels=16, dim=width, cap_feat_dim=64, n_layers=2,
                  qk_norm=True, **z_image)

    def __init__(self, seed: int = 0):
        self.seed = seed

    @classmethod
    def model_z_image_at_tiny_width(cls) -> None:
        import comfy.model_detection
        import comfy.supported_models

        detect = comfy.model_detection.detect_unet_config
        if getattr(detect, "tiny_z_image", False):
            return

        def detect_unet_config(state_dict, key_prefix, *args, **kwargs):
            config = detect(state_dict, key_prefix, *args, **kwargs)
            if config and config.get("image_model") == "lumina2" and config.get("dim") == cls.width:
                config.update(cls.z_image)
            return config

        detect_unet_config.tiny_z_image = True
        comfy.model_detection.detect_unet_config = detect_unet_config
        comfy.supported_models.ZImage.unet_config = dict(comfy.supported_models.ZImage.unet_config, dim=cls.width)

    def build(self) -> dict:
        import comfy.ldm.lumina.model
        import comfy.ops

        with torch.device("meta"):
            model = comfy.ldm.lumina.model.NextDiT(dtype=torch.float32, operations=comfy.ops.disable_weight_init,
                                                   **self.config)
        return _fill(model, self.seed, self.is_modulation, 0)

    @staticmethod
    def is_modulation(key: str) -> bool:
        return "adaLN_modulation" in key

    def quantized(self, key: str, t: torch.Tensor) -> bool:
        return False

    def latent(self) -> torch.Tensor:
        return torch.zeros(1, 16, 16, 16)

    def conditioning(self, seed: int):
        gen = torch.Generator().manual_seed(seed + 100)
        cond = torch.randn(1, 12, self.config["cap_feat_dim"], generator=gen)
        return [[cond, {}]], [[torch.zeros_like(cond), {}]]
