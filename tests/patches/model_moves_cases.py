"""ComfyUI prompts that load a model onto the device and unload it, for patches/comfyui/loading/model_moves
and patches/comfyui/reports/prompt_stages.

    python model_moves_cases.py <comfyui-dir> [--prompts N] [--workflow] [-- <ComfyUI flags>]

Starts ComfyUI as main.py does, registers custom nodes and runs ``execution.PromptExecutor(...).execute``
on a one-node prompt N times. ``MoveProbe`` hands a small model (two 1024x1024 fp32 linears, 8 MiB)
to ComfyUI's own ``load_models_gpu`` and then ``unload_all_models``, as a workflow under
``--disable-smart-memory`` does with its models. With ``--workflow`` the node is ``MiniMaxProbe``:
the seed user's MiniMax-H3 workflow at a tiny width (tests/e2e's tiny files: ComfyUI's own
``load_clip`` and CLIPTextEncode's encoding, ``load_diffusion_model`` and KSampler's
``comfy.sample.sample`` for 2 steps, VAEDecode with the video VAE, LTXVAudioVAEDecode with the
audio VAE); its odd prompts feed the DiT a latent of the wrong width, so they fail in sampling.
Prints one JSON object: the patch rows, where the weights were during and after the node, the
shim's ``model_moves`` section and the log lines the shim wrote.
"""

import io
import json
import logging
import sys

COMFY_DIR = sys.argv[1]
split = sys.argv.index("--") if "--" in sys.argv else len(sys.argv)
OPTIONS = sys.argv[2:split]
PROMPTS = int(OPTIONS[OPTIONS.index("--prompts") + 1]) if "--prompts" in OPTIONS else 2
WORKFLOW = "--workflow" in OPTIONS

log_stream = io.StringIO()
logging.basicConfig(level=logging.INFO, stream=log_stream, format="%(name)s %(levelname)s %(message)s")
from comfyui_start import start_comfyui  # noqa: E402

start_comfyui(COMFY_DIR, sys.argv[split + 1:], cuda_malloc=True)
import comfy.model_management as mm  # noqa: E402
import comfy.model_patcher  # noqa: E402
import torch  # noqa: E402

import execution  # noqa: E402
import nodes  # noqa: E402

placements = []


class MoveProbe:
    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"seed": ("INT", {"default": 0})}}

    RETURN_TYPES = ()
    FUNCTION = "run"
    OUTPUT_NODE = True
    CATEGORY = "testing"

    def run(self, seed):
        model = torch.nn.Sequential(torch.nn.Linear(1024, 1024, bias=False), torch.nn.Linear(1024, 1024, bias=False))
        patcher = comfy.model_patcher.ModelPatcher(model, load_device=mm.get_torch_device(),
                                                   offload_device=mm.unet_offload_device())
        mm.load_models_gpu([patcher])
        loaded = str(next(model.parameters()).device)
        mm.unload_all_models()
        placements.append({"loaded": loaded, "unloaded": str(next(model.parameters()).device)})
        return {}


nodes.NODE_CLASS_MAPPINGS["MoveProbe"] = MoveProbe


class MiniMaxProbe(MoveProbe):
    """The seed user's workflow in one node: text encoder, DiT, video VAE, audio VAE (tiny)."""

    def run(self, seed):
        import os

        import comfy.sample
        import comfy.sd
        import comfy.utils
        import safetensors.torch
        from comfy_extras.nodes_lt import LTXVSeparateAVLatent
        from comfy_extras.nodes_lt_audio import LTXVAudioVAEDecode

        sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "e2e"))
        import tiny_models
        import tiny_text_encoder
        import tiny_vaes

        folder = os.environ["MINIMAX_FILES"]
        files = {name: os.path.join(folder, name + ".safetensors") for name in ("te", "dit", "video", "audio")}
        spec = tiny_models.MiniMaxH3Spec(seed=0)
        tiny_text_encoder.model_qwen3vl_32b_at_tiny_width()
        tiny_vaes.model_minimax_vaes_at_tiny_width()
        if not os.path.exists(files["te"]):
            tiny_text_encoder.write(files["te"], "bf16")
            safetensors.torch.save_file(tiny_models.checkpoint(spec.build(), spec, "bf16"), files["dit"])
            for name, make in (("video", tiny_vaes.minimax_video_vae), ("audio", tiny_vaes.minimax_audio_vae)):
                safetensors.torch.save_file({k: t.to(torch.bfloat16).contiguous() for k, t in make().items()},
                                            files[name])

        def vae(name):
            sd, metadata = comfy.utils.load_torch_file(files[name], return_metadata=True)
            return comfy.sd.VAE(sd=sd, metadata=metadata)

        clip = comfy.sd.load_clip([files["te"]], clip_type=comfy.sd.CLIPType.MINIMAX)
        positive, negative = tiny_text_encoder.encode(clip)
        patcher = comfy.sd.load_diffusion_model(files["dit"])
        latent = spec.latent()
        if seed % 2:
            latent = latent[:, :-1]  # a latent of the wrong width: the DiT raises in sampling
        noise = comfy.sample.prepare_noise(latent, seed)
        samples = comfy.sample.sample(patcher, noise, 2, 1.0, "euler", "simple", positive, negative, latent,
                                      denoise=1.0, disable_pbar=True, seed=seed)
        video_latent, audio_latent = LTXVSeparateAVLatent.execute({"samples": samples}).result
        nodes.VAEDecode().decode(vae("video"), video_latent)
        LTXVAudioVAEDecode.execute(audio_latent, vae("audio"))
        return {}


nodes.NODE_CLASS_MAPPINGS["MiniMaxProbe"] = MiniMaxProbe
NODE = "MiniMaxProbe" if WORKFLOW else "MoveProbe"


class Server:
    client_id = None
    last_node_id = None
    last_prompt_id = None

    def send_sync(self, *args, **kwargs):
        pass


successes = []
executor = execution.PromptExecutor(Server(), cache_type=execution.CacheType.NONE,
                                    cache_args={"lru": 0, "ram": 0, "ram_inactive": 0})
for index in range(PROMPTS):
    executor.execute({"1": {"class_type": NODE, "inputs": {"seed": index}}}, "prompt-%d" % index, {}, ["1"])
    successes.append(executor.success)

import ascend_shim  # noqa: E402

status = ascend_shim.status()
rows = {row["name"]: {"state": row["state"], "reason": row.get("reason")} for row in status["patches"]}
print(json.dumps({"success": executor.success, "successes": successes, "rows": rows, "placements": placements,
                  "model_moves": status.get("model_moves"),
                  "log": [line for line in log_stream.getvalue().splitlines() if line.startswith("ascend_shim")]},
                 default=str))
