"""ComfyUI's own MiniMax-H3 audio VAE, tiny and seeded, decoded and encoded on a real ComfyUI tree.

    python vae_dtype_cases.py <comfyui-dir> [-- <ComfyUI flags>]

``comfy.ldm.minimax.audio_vae.MiniMaxH3AudioVAE`` at tiny sizes (its
constructor's defaults shrunk, so that ``comfy.sd.VAE`` builds the tiny one
when it detects the architecture from the state dict, as a user's file is
detected); ``comfy.sd.VAE(sd=...)`` picks the dtype from the VAE's declared
``working_dtypes`` and ComfyUI's flags. One VAE is built per setting (none,
``--fp16-vae``, ``--bf16-vae``: ``comfy.cli_args.args`` set as the command line
sets it), each decoding twice and encoding once, as VAEDecodeAudio /
VAEEncodeAudio do.

Prints one JSON object: the patch row and, per setting, the VAE's dtype and
declaration, the shim's lines while it ran, the outputs' statistics, the kept
finding and what the simulated machine itself recorded outside torch_npu's
dtype table.
"""

import io
import json
import logging
import sys

COMFY_DIR = sys.argv[1]
split = sys.argv.index("--") if "--" in sys.argv else len(sys.argv)

SETTINGS = ("", "--fp16-vae", "--bf16-vae")  # the last one's finding stays kept, for doctor
log_stream = io.StringIO()
logging.basicConfig(level=logging.INFO, stream=log_stream, format="%(name)s %(levelname)s %(message)s")
from comfyui_start import start_comfyui  # noqa: E402

start_comfyui(COMFY_DIR, sys.argv[split + 1:], cuda_malloc=True)
import torch  # noqa: E402

import comfy.sd  # noqa: E402
from comfy.ldm.minimax import audio_vae  # noqa: E402

# tiny: encoder 4 wide with hops 2x2, latent width 16, BigVGAN 128 wide (7 upsamples down to 1 channel)
TINY = (4, (2, 2), 16, 128, 32)
audio_vae.MiniMaxH3AudioVAE.__init__.__defaults__ = TINY
torch.manual_seed(0)
model = audio_vae.MiniMaxH3AudioVAE()
sd = {k: (torch.randn_like(v) * 0.2 if v.is_floating_point() else v) for k, v in model.state_dict().items()}
sd["latents_mean"] = torch.zeros(32)
sd["latents_std"] = torch.ones(32)
g = torch.Generator().manual_seed(1)
latent = torch.randn(1, 32, 2, 3, generator=g)
audio = torch.rand(1, 1600, 2, generator=g) * 2 - 1  # VAEEncodeAudio hands [B, samples, channels]

import ascend_shim  # noqa: E402
from ascend_shim.engine import kept  # noqa: E402
from testbed import npu_device  # noqa: E402

args = comfy.model_management.args
results = {}
for setting in SETTINGS:
    # as ComfyUI's command line sets them; a VAE reads them when it is built
    args.bf16_vae, args.fp16_vae = setting == "--bf16-vae", setting == "--fp16-vae"
    vae = comfy.sd.VAE(sd=sd)
    npu_device.reset_dtype_findings()
    sys.stderr.flush()
    lines, sys.stderr = sys.stderr, io.StringIO()  # the shim's lines of this VAE alone
    try:
        with torch.inference_mode():
            decoded = [vae.decode(latent).float() for _ in range(2)]
            encoded = vae.encode(audio).float()
    finally:
        lines, sys.stderr = sys.stderr, lines
    results[setting or "default"] = {
        "vae_dtype": str(vae.vae_dtype), "working_dtypes": [str(d) for d in vae.working_dtypes],
        "device": str(vae.device),
        "lines": [text for text in lines.getvalue().splitlines() if text.startswith("ascend_shim:")],
        "decode_equal": torch.equal(decoded[0], decoded[1]),
        "finite": bool(torch.isfinite(decoded[0]).all() and torch.isfinite(encoded).all()),
        "kept": kept.load("vae_dtype"),
        "bed_dtype_findings": sorted([label, str(dtype).replace("torch.", "")]
                                     for label, dtype in npu_device.dtype_findings())}
    del vae
    comfy.model_management.unload_all_models()

rows = {row["name"]: {"state": row["state"], "reason": row.get("reason")} for row in ascend_shim.status()["patches"]}
print(json.dumps({"row": rows.get("vae_dtype"), "settings": results}))
