"""Tiny, seeded VAEs of the end-to-end workflows, in the layout ComfyUI 0.30.0's ``comfy.sd.VAE`` detects.

Each file is built from ComfyUI's own class, so its keys are the real ones and
``comfy.sd.VAE`` detects the architecture from them (the keys and shapes it
looks at are named below):

- Flux / Z-Image ``AutoencoderKL`` (``decoder.conv_in.weight`` with 16 latent
  channels): ComfyUI fixes the encoder's width (``ch`` 128) and reads the
  decoder's from ``decoder.conv_in`` (its ``ch`` is conv_in's width / 4), so
  the encoder is full size (34M parameters) and the decoder tiny (``ch`` 32).
- Wan 2.1 (``decoder.middle.0.residual.0.gamma``, no Wan 2.2 upsample key):
  ComfyUI reads ``dim`` from ``decoder.head.0.gamma``: 16 here (96 in Wan 2.1).
- MiniMax-H3's video VAE (``decoder.transformer_blocks.0.scale1`` and
  ``encoder.down.5.block.0.conv1.weight``) and audio VAE
  (``pre_block.attn.zero_k_bias``): ComfyUI builds them with no size argument
  (2.6B and 151M parameters), so ``model_minimax_vaes_at_tiny_width`` swaps
  the two classes, in this interpreter's ``comfy.ldm.minimax`` modules, for
  subclasses with smaller defaults (same blocks, fewer channels and layers),
  as ``tiny_text_encoder`` does for the text encoder. Test code only.

Buffers that the class computes itself (the audio VAE's anti-aliasing filters,
the video VAE's latent statistics) keep the class's values; the audio VAE's
latent statistics (empty buffers, read from the file) get mean 0, std ~1.
"""

from __future__ import annotations

import torch

from tiny_models import _fill

FLUX_VAE_DDCONFIG = {"double_z": True, "z_channels": 16, "resolution": 256, "in_channels": 3, "out_ch": 3,
                     "ch": 128, "ch_mult": [1, 2, 4, 4], "num_res_blocks": 2, "attn_resolutions": [],
                     "dropout": 0.0}
FLUX_VAE_DECODER_CH = 32
WAN_VAE_DIM = 16


def _values(module: torch.nn.Module, seed: int, keep=()) -> dict:
    """Seeded fp32 values of every parameter and buffer; buffers named in ``keep`` stay as built."""
    out = _fill(module, seed, lambda key: False)
    built = module.state_dict()
    for key in keep:
        out[key] = built[key].float().clone()
    return out


def flux_vae(seed: int = 11) -> dict:
    """Flux's ae.safetensors layout (AutoencodingEngine: encoder.*, decoder.*; no quant convs)."""
    import comfy.ldm.modules.diffusionmodules.model as model

    decoder_config = dict(FLUX_VAE_DDCONFIG, ch=FLUX_VAE_DECODER_CH)
    with torch.device("meta"):
        encoder = model.Encoder(**FLUX_VAE_DDCONFIG)
        decoder = model.Decoder(**decoder_config)
    out = {"encoder." + k: v for k, v in _fill(encoder, seed, lambda key: False).items()}
    out.update({"decoder." + k: v for k, v in _fill(decoder, seed + 1, lambda key: False).items()})
    return out


def wan21_vae(seed: int = 12) -> dict:
    import comfy.ldm.wan.vae

    with torch.device("meta"):
        vae = comfy.ldm.wan.vae.WanVAE(dim=WAN_VAE_DIM, z_dim=16, dim_mult=[1, 2, 4, 4], num_res_blocks=2,
                                       attn_scales=[], temperal_downsample=[False, True, True], image_channels=3,
                                       conv_out_channels=3, dropout=0.0)
    return _fill(vae, seed, lambda key: False)


def model_minimax_vaes_at_tiny_width() -> None:
    """Swap ComfyUI's MiniMax-H3 VAE classes for tiny subclasses (call before ``comfy.sd.VAE``).

    Video: the 3D causal CNN encoder keeps its six levels (``ch`` 32, every
    level 32 channels instead of 128..1024), the ViT3D decoder 2 layers of 2
    heads x 32 (36 x 32 x 64); patch sizes, tiling and chunking are unchanged.
    Audio: the DAC encoder from 8 channels (64), a 64-wide latent (2048), the
    BigVGAN decoder from 256 channels (1024); rates and kernels unchanged.
    """
    import comfy.ldm.minimax.audio_vae as audio
    import comfy.ldm.minimax.vae as video

    if getattr(video.MiniMaxH3VideoVAE, "tiny", False):
        return
    full_video, full_decoder, full_audio = video.MiniMaxH3VideoVAE, video.ViT3DDecoder, audio.MiniMaxH3AudioVAE

    class TinyViT3DDecoder(full_decoder):
        def __init__(self, *args, **kwargs):
            kwargs.update(num_layers=2, heads=2, dim_head=32)
            super().__init__(*args, **kwargs)

    class TinyMiniMaxH3VideoVAE(full_video):
        tiny = True

        def __init__(self, *args, **kwargs):
            kwargs.setdefault("ch", 32)
            kwargs.setdefault("ch_mult", (1, 1, 1, 1, 1, 1))
            super().__init__(*args, **kwargs)

    class TinyMiniMaxH3AudioVAE(full_audio):
        tiny = True

        def __init__(self, *args, **kwargs):
            kwargs.setdefault("encoder_dim", 8)
            kwargs.setdefault("latent_dim", 64)
            kwargs.setdefault("decoder_dim", 256)
            super().__init__(*args, **kwargs)

    video.ViT3DDecoder = TinyViT3DDecoder  # read by MiniMaxH3VideoVAE.__init__ at call time
    video.MiniMaxH3VideoVAE = TinyMiniMaxH3VideoVAE
    audio.MiniMaxH3AudioVAE = TinyMiniMaxH3AudioVAE


def minimax_video_vae(seed: int = 13) -> dict:
    import comfy.ldm.minimax.vae as video

    if not getattr(video.MiniMaxH3VideoVAE, "tiny", False):
        raise RuntimeError("call model_minimax_vaes_at_tiny_width() first: this is the full-size VAE")
    vae = video.MiniMaxH3VideoVAE()
    out = _values(vae, seed, keep=("latents_mean", "latents_std"))
    # the blocks' residual scales (LayerScale) start small, as trained ones are
    for key in out:
        if key.endswith((".scale1", ".scale2")):
            out[key] = out[key] * 0.1
    return out


def minimax_audio_vae(seed: int = 14) -> dict:
    import comfy.ldm.minimax.audio_vae as audio

    if not getattr(audio.MiniMaxH3AudioVAE, "tiny", False):
        raise RuntimeError("call model_minimax_vaes_at_tiny_width() first: this is the full-size VAE")
    vae = audio.MiniMaxH3AudioVAE()
    filters = [k for k in vae.state_dict() if k.endswith(".filter")]  # fixed anti-aliasing windows
    out = _values(vae, seed, keep=filters)
    gen = torch.Generator().manual_seed(seed + 1)
    out["latents_mean"] = torch.randn(out["latents_mean"].shape, generator=gen) * 0.1
    out["latents_std"] = 1.0 + torch.rand(out["latents_std"].shape, generator=gen) * 0.1
    out["decoder.conv_post.weight"] *= 0.1  # a waveform mostly inside the decoder's clamp to [-1, 1]
    return out


def waveform_length(audio_latent_frames: int) -> int:
    """Samples per stereo channel that the audio VAE decodes from ``audio_latent_frames`` (800 each)."""
    return audio_latent_frames * 800


def describe(vae) -> dict:
    """What ComfyUI built from a file: the first-stage class, its dtype and device."""
    params = list(vae.first_stage_model.parameters())
    return {"class": type(vae.first_stage_model).__mro__[0].__name__.removeprefix("Tiny"),
            "vae_dtype": str(vae.vae_dtype), "device": str(vae.device),
            "parameters": sum(p.numel() for p in params),
            "weight_dtypes": sorted({str(p.dtype) for p in params})}
