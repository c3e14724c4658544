"""Whole ComfyUI workflows, stage by stage, on a real ComfyUI tree, in a fresh interpreter.

    python workflow_cases.py <comfyui-dir> <out-dir> --reference|--device [--stages minimax,flux,zimage,wan,samplers]
                             [-- <ComfyUI flags>]

Each stage runs what a user's workflow runs, with ComfyUI's own loaders and
nodes on tiny seeded files built from ComfyUI's own classes (``tiny_models``,
``tiny_text_encoder``, ``tiny_vaes``):

  minimax   MiniMax-H3's text encoder (CLIPTextEncode) -> its DiT (3 steps of
            KSampler on EmptyMiniMaxH3LatentAV's latent) -> LTXVSeparateAVLatent
            -> VAEDecode with the video VAE and LTXVAudioVAEDecode with the audio VAE
  flux      the Flux DiT (3 steps) -> VAEDecode with Flux's AutoencoderKL
  wan       the Wan 2.1 VAE: VAEDecode of a seeded video latent, VAEEncode of the frames
  samplers  every sampler in KSampler.SAMPLERS (scheduler "simple") and every
            scheduler in KSampler.SCHEDULERS (sampler "euler") for 3 steps of a tiny Flux DiT

``--reference`` is the fp32 CPU reference (run it with ``--cpu`` and
ASCEND_SHIM=0: fp32 files, the DiTs loaded in fp32), ``--device`` what a user
runs (bf16 files, ComfyUI's default dtypes). Each stage's output goes to
``<out-dir>/<stage>.pt`` (CPU fp32); one JSON object on stdout says per stage
(and per sampler) the seconds, the bed's counters (ops that ran on the CPU
because the simulated torch_npu has no NPU kernel for them, torch_npu's
errors), float8 tensors found on the device, what ComfyUI built, and whether
the sampler drew its noise from a generator on the model's device.
The assertions live in ``test_workflow.py``.
"""

import argparse
import io
import json
import logging
import os
import sys
import time

from comfyui_start import start_comfyui

START = time.monotonic()
parser = argparse.ArgumentParser()
parser.add_argument("comfy_dir")
parser.add_argument("out_dir")
mode = parser.add_mutually_exclusive_group(required=True)
mode.add_argument("--reference", action="store_true", help="fp32 files and DiTs (the CPU reference)")
mode.add_argument("--device", action="store_true", help="bf16 files, ComfyUI's default dtypes")
parser.add_argument("--stages", default="minimax,flux,zimage,wan,samplers")
parser.add_argument("--steps", type=int, default=3)
split = sys.argv.index("--") if "--" in sys.argv else len(sys.argv)
OPTS = parser.parse_args(sys.argv[1:split])
FLAGS = sys.argv[split + 1:]
FILE_DTYPE = "fp32" if OPTS.reference else "bf16"

log_stream = io.StringIO()
logging.basicConfig(level=logging.INFO, stream=log_stream, format="%(name)s %(levelname)s %(message)s")
report = {"flags": FLAGS, "stages": {}}


def emit():
    report["seconds"] = round(time.monotonic() - START, 2)
    times = os.times()
    report["cpu_seconds"] = round(times.user + times.system, 2)
    report["log"] = log_stream.getvalue().splitlines()[-40:]
    print(json.dumps(report, default=str))


def error_line(exc):
    text = str(exc).strip().splitlines()
    return "%s: %s" % (type(exc).__name__, text[0] if text else "")


report["stand_ins"] = start_comfyui(OPTS.comfy_dir, FLAGS)
import comfy.model_management as mm  # noqa: E402
import comfy.quant_ops  # noqa: E402
import torch  # noqa: E402

import comfy.sample  # noqa: E402
import comfy.samplers  # noqa: E402
import comfy.sd  # noqa: E402
import comfy.utils  # noqa: E402
import nodes  # noqa: E402
import safetensors.torch  # noqa: E402
from comfy.quant_ops import QuantizedTensor  # noqa: E402
from comfy_extras.nodes_lt import LTXVSeparateAVLatent  # noqa: E402
from comfy_extras.nodes_lt_audio import LTXVAudioVAEDecode  # noqa: E402

import tiny_flux_text_encoders as flux_text  # noqa: E402
import tiny_models as models  # noqa: E402  (beside this script)
import tiny_text_encoder as text_encoder  # noqa: E402
import tiny_vaes as vaes  # noqa: E402

try:
    from testbed import machine, npu_device
except ImportError:
    machine = npu_device = None
on_npu = machine is not None and machine.active() in ("ascend-cu130", "ascend-cpu") and "torch_npu" in sys.modules
report["device"] = str(mm.get_torch_device())
report["torch"] = torch.__version__
DEVICE_TYPE = mm.get_torch_device().type


# --------------------------------------------------------------------------- what the bed saw


class RecordingGenerator(torch.Generator):
    """torch.Generator as ComfyUI's samplers call it, remembering the devices asked for."""

    devices: list = []

    def __new__(cls, device=None, *args, **kwargs):
        target = device if device is not None else kwargs.get("device")
        RecordingGenerator.devices.append(str(torch.device(target).type) if target is not None else "cpu")
        return super().__new__(cls, device) if device is not None else super().__new__(cls, *args, **kwargs)


torch.Generator = RecordingGenerator


SAMPLER_OPS = "ascend_shim.aten.sampler_ops"  # the shim's own NPU kernels for ops torch_npu lacks


def reset_counters():
    RecordingGenerator.devices.clear()
    if on_npu:
        import torch_npu

        torch_npu._testbed.reset()
        npu_device.reset_cpu_fallbacks()
        if SAMPLER_OPS in sys.modules:
            sys.modules[SAMPLER_OPS].REGISTRATION.reset_calls()
        npu_device.reset_dtype_findings()


def counters():
    out = {"generators": sorted(set(RecordingGenerator.devices))}
    if on_npu:
        import torch_npu

        out["fallbacks"] = dict(npu_device.cpu_fallbacks())
        out["errors"] = [list(e) for e in torch_npu._testbed.errors][:5]
        out["npu_ops"] = {op: n for op, n in sorted(torch_npu._testbed.calls.items()) if n}  # torch_npu's own ops
        if SAMPLER_OPS in sys.modules:  # e.g. aten::_linalg_solve_ex for uni_pc
            out["shim_kernels"] = sys.modules[SAMPLER_OPS].REGISTRATION.report()["calls"]
        # calls outside torch_npu's documented dtype table (testbed/dtype_table.py): "op dtype" -> count
        out["dtype_findings"] = {"%s %s" % key: n for key, n in sorted(npu_device.dtype_findings().items())}
    return out


def tensors_of(module):
    for name, t in list(module.named_parameters()) + list(module.named_buffers()):
        if isinstance(t, QuantizedTensor):
            yield name, t._qdata
        else:
            yield name, t


def placement(module):
    """Tensors per device type and the float8 ones on a device."""
    where = {}
    float8 = []
    for name, t in tensors_of(module):
        where[t.device.type] = where.get(t.device.type, 0) + 1
        if t.device.type != "cpu" and t.dtype.itemsize == 1 and t.dtype.is_floating_point:
            float8.append(name)
    return {"devices": where, "float8_on_device": float8}


def flat(t):
    if getattr(t, "is_nested", False):
        t = t.unbind()
    if isinstance(t, (list, tuple)):
        return torch.cat([flat(x) for x in t])
    return t.detach().float().cpu().flatten()


def entry_is_stage(stage):
    return report["stages"].get(stage.name) is stage.entry


class Stage:
    """One stage: timed, its counters taken, its outputs saved; an error ends it, not the run.

    It runs under ``torch.inference_mode()``, as ComfyUI's executor runs a whole prompt (loaders,
    encoders, samplers, decoders): composite ops reach the device whole there."""

    def __init__(self, name, entry=None):
        self.name = name
        self.entry = report["stages"].setdefault(name, {"stage": "start"}) if entry is None else entry
        self.outputs = {}

    def __enter__(self):
        self.inference = torch.inference_mode()
        self.inference.__enter__()
        reset_counters()
        self.started = time.monotonic()
        return self

    def __exit__(self, kind, exc, tb):
        self.inference.__exit__(None, None, None)
        self.entry["seconds"] = round(time.monotonic() - self.started, 2)
        self.entry["counters"] = counters()
        if exc is not None:
            self.entry["error"] = error_line(exc)
            logging.exception("stage %s", self.name)
        else:
            self.entry["stage"] = "done"
        if self.outputs and entry_is_stage(self):
            self.entry["finite"] = {k: bool(torch.isfinite(v).all()) for k, v in self.outputs.items()}
            self.entry["shapes"] = {k: list(v.shape) for k, v in self.outputs.items()}
            torch.save({k: v.detach().float().cpu() for k, v in self.outputs.items()},
                       os.path.join(OPTS.out_dir, "%s.pt" % self.name))
        return kind is not None and issubclass(kind, Exception)

    def seen(self, key, module):
        self.entry.setdefault("placement", {})[key] = placement(module)


def path_of(name):
    return os.path.join(OPTS.out_dir, name + ".safetensors")


def save(name, state_dict, dtype_name=FILE_DTYPE):
    dtype = {"bf16": torch.bfloat16, "fp32": torch.float32}[dtype_name]
    safetensors.torch.save_file({k: t.to(dtype).contiguous() for k, t in state_dict.items()}, path_of(name))
    return path_of(name)


def load_vae(name, make_state_dict):
    """What the VAELoader node does with a file (written once per run)."""
    if not os.path.exists(path_of(name)):
        save(name, make_state_dict())
    sd, metadata = comfy.utils.load_torch_file(path_of(name), return_metadata=True)
    vae = comfy.sd.VAE(sd=sd, metadata=metadata)
    vae.throw_exception_if_invalid()
    return vae


def load_dit(spec, master):
    """load_diffusion_model: the bf16 file with ComfyUI's default dtype, or the fp32 reference in fp32."""
    if OPTS.reference:
        safetensors.torch.save_file(master, path_of(spec.name))
        return comfy.sd.load_diffusion_model(path_of(spec.name), model_options={"dtype": torch.float32})
    safetensors.torch.save_file(models.checkpoint(master, spec, "bf16"), path_of(spec.name))
    return comfy.sd.load_diffusion_model(path_of(spec.name))


def ksampler(stage, patcher, latent, positive, negative, sampler="euler", scheduler="simple", seed=7,
             sampler_seed=None):
    """The KSampler node's sampling (cfg 1), the weights' placement seen from inside the model."""
    looked = []

    def look(module, args):
        if not looked:
            looked.append(1)
            stage.seen("diffusion_model", module)

    hook = patcher.model.diffusion_model.register_forward_pre_hook(look)
    try:
        noise = comfy.sample.prepare_noise(latent, seed)
        out = comfy.sample.sample(patcher, noise, OPTS.steps, 1.0, sampler, scheduler, positive, negative, latent,
                                  denoise=1.0, disable_pbar=True, seed=seed if sampler_seed is None else sampler_seed)
    finally:
        hook.remove()
    noise = patcher.model.process_latent_out(noise)  # what a zero velocity would leave: the noise itself
    stage.entry["model"] = {"config": type(patcher.model.model_config).__name__,
                            "compute_dtype": str(patcher.model.get_dtype())}
    return out, noise


def seeded(*shape, seed=21):
    """A latent both legs decode alike: the VAE's own error, apart from the DiT's."""
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def vae_decode(stage, key, vae, samples):
    """The VAEDecode node on a LATENT (a dict with "samples")."""
    stage.entry.setdefault("vaes", {})[key] = vaes.describe(vae)
    (images,) = nodes.VAEDecode().decode(vae, samples)
    stage.seen(key, vae.first_stage_model)
    return images


# --------------------------------------------------------------------------- stages


def minimax():
    spec = models.MiniMaxH3Spec(seed=0)
    with Stage("minimax") as stage:
        stage.entry["stage"] = "text encoder"
        text_encoder.model_qwen3vl_32b_at_tiny_width()
        text_encoder.write(path_of("text_encoder"), FILE_DTYPE)
        clip = comfy.sd.load_clip([path_of("text_encoder")], clip_type=comfy.sd.CLIPType.MINIMAX)
        positive, negative = text_encoder.encode(clip)
        stage.seen("text_encoder", clip.cond_stage_model)
        del clip
        mm.unload_all_models()
        stage.entry["stage"] = "dit"
        patcher = load_dit(spec, spec.build())
        av_latent, noise = ksampler(stage, patcher, spec.latent(), positive, negative)
        del patcher
        mm.unload_all_models()
        stage.entry["stage"] = "separate"
        video_latent, audio_latent = LTXVSeparateAVLatent.execute({"samples": av_latent}).result
        stage.entry["stage"] = "video vae"
        vaes.model_minimax_vaes_at_tiny_width()
        video_vae = load_vae("minimax_video_vae", vaes.minimax_video_vae)
        video = vae_decode(stage, "video_vae", video_vae, video_latent)
        video_alone = vae_decode(stage, "video_vae", video_vae, {"samples": seeded(*video_latent["samples"].shape)})
        mm.unload_all_models()
        stage.entry["stage"] = "audio vae"
        audio_vae = load_vae("minimax_audio_vae", vaes.minimax_audio_vae)
        stage.entry["vaes"]["audio_vae"] = vaes.describe(audio_vae)
        (audio,) = LTXVAudioVAEDecode.execute(audio_latent, audio_vae).result
        (audio_alone,) = LTXVAudioVAEDecode.execute({"samples": seeded(*audio_latent["samples"].shape)},
                                                    audio_vae).result
        stage.seen("audio_vae", audio_vae.first_stage_model)
        mm.unload_all_models()
        stage.outputs.update(latent=flat(av_latent) - flat(noise), video=video, audio=audio["waveform"],
                             video_vae_alone=video_alone, audio_vae_alone=audio_alone["waveform"])


def flux():
    spec = models.FluxSpec(seed=0)
    with Stage("flux") as stage:
        stage.entry["stage"] = "text encoders"
        clip_l, t5xxl = flux_text.state_dicts()
        clip = comfy.sd.load_clip([save("clip_l", clip_l), save("t5xxl", t5xxl)], clip_type=comfy.sd.CLIPType.FLUX,
                                  model_options=flux_text.model_options())
        stage.entry["text_encoders"] = {
            name: {"class": type(encoder.transformer).__name__,
                   "weight_dtypes": sorted({str(p.dtype) for p in encoder.transformer.parameters()})}
            for name, encoder in (("clip_l", clip.cond_stage_model.clip_l), ("t5xxl", clip.cond_stage_model.t5xxl))}
        positive, negative = flux_text.encode(clip)
        stage.seen("text_encoders", clip.cond_stage_model)
        stage.outputs.update(t5xxl=positive[0][0], clip_l_pooled=positive[0][1]["pooled_output"])
        del clip
        mm.unload_all_models()
        stage.entry["stage"] = "dit"
        patcher = load_dit(spec, spec.build())
        latent, noise = ksampler(stage, patcher, spec.latent(), positive, negative)
        del patcher
        mm.unload_all_models()
        stage.entry["stage"] = "vae"
        vae = load_vae("flux_vae", vaes.flux_vae)
        image = vae_decode(stage, "vae", vae, {"samples": latent})
        image_alone = vae_decode(stage, "vae", vae, {"samples": seeded(*latent.shape)})
        mm.unload_all_models()
        stage.outputs.update(latent=flat(latent) - flat(noise), image=image, vae_alone=image_alone)


def zimage():
    spec = models.ZImageSpec(seed=0)
    spec.model_z_image_at_tiny_width()
    with Stage("zimage") as stage:
        stage.entry["stage"] = "dit"
        patcher = load_dit(spec, spec.build())
        stage.entry["unet_config"] = {k: v for k, v in patcher.model.model_config.unet_config.items()
                                      if isinstance(v, (int, float, str, bool))}
        positive, negative = spec.conditioning(7)
        rope = count_calls(comfy.quant_ops.ck, "rms_rope")
        try:
            latent, noise = ksampler(stage, patcher, spec.latent(), positive, negative)
        finally:
            stage.entry["ck_rms_rope_calls"] = rope.stop()
        del patcher
        mm.unload_all_models()
        stage.entry["stage"] = "vae"
        vae = load_vae("flux_vae", vaes.flux_vae)  # Z-Image decodes with Flux's ae.safetensors
        image = vae_decode(stage, "vae", vae, {"samples": latent})
        mm.unload_all_models()
        stage.outputs.update(latent=flat(latent) - flat(noise), image=image)


class count_calls:
    """Count the calls of ``owner.name`` (a module's function) until ``stop()``."""

    def __init__(self, owner, name):
        self.owner, self.name, self.calls = owner, name, 0
        self.original = getattr(owner, name)

        def counted(*args, **kwargs):
            self.calls += 1
            return self.original(*args, **kwargs)

        setattr(owner, name, counted)

    def stop(self):
        setattr(self.owner, self.name, self.original)
        return self.calls


def wan():
    with Stage("wan") as stage:
        latent = seeded(1, 16, 2, 8, 8)  # 5 frames of 64x64
        vae = load_vae("wan21_vae", vaes.wan21_vae)
        frames = vae_decode(stage, "vae", vae, {"samples": latent})
        stage.entry["stage"] = "encode"
        (encoded,) = nodes.VAEEncode().encode(vae, frames)
        # the encoder's own error: both legs encode the same frames
        (encoded_alone,) = nodes.VAEEncode().encode(vae, seeded(5, 64, 64, 3).sigmoid())
        mm.unload_all_models()
        stage.outputs.update(frames=frames, latent=encoded["samples"], encode_alone=encoded_alone["samples"])


def samplers():
    """Every sampler and scheduler, 3 steps each, on one tiny Flux DiT loaded once."""
    spec = models.FluxSpec(seed=1)
    latent = torch.zeros(1, 16, 8, 8)
    positive, negative = spec.conditioning(7)
    with Stage("samplers") as stage:
        patcher = load_dit(spec, spec.build())
        runs = [(s, "simple") for s in comfy.samplers.KSampler.SAMPLERS]
        runs += [("euler", s) for s in comfy.samplers.KSampler.SCHEDULERS if s != "simple"]
        entries = stage.entry["runs"] = {}
        fallbacks = {}
        for sampler, scheduler in runs:
            key = "%s/%s" % (sampler, scheduler)
            entry = entries[key] = {"stage": "start"}
            with Stage(key, entry) as run:
                out, noise = ksampler(run, patcher, latent, positive, negative, sampler, scheduler)
                stage.outputs[key] = flat(out) - flat(noise)
                entry["finite"] = bool(torch.isfinite(stage.outputs[key]).all())
            # noise from a generator on the model's device (a real NPU's own random stream): the sampler made
            # one there and its result moves with the sampler's seed (same starting noise, seed + 1)
            entry["device_noise"] = False
            if DEVICE_TYPE != "cpu" and DEVICE_TYPE in entry["counters"]["generators"] and entry.get("finite"):
                other, _ = ksampler(Stage(key, {}), patcher, latent, positive, negative, sampler, scheduler,
                                    sampler_seed=8)
                entry["device_noise"] = not torch.equal(flat(other) - flat(noise), stage.outputs[key])
            for op, n in entry["counters"].get("fallbacks", {}).items():
                fallbacks[op] = fallbacks.get(op, 0) + n
        stage.entry["fallbacks"] = fallbacks
        del patcher
        mm.unload_all_models()


STAGES = {"minimax": minimax, "flux": flux, "zimage": zimage, "wan": wan, "samplers": samplers}
for name in OPTS.stages.split(","):
    STAGES[name]()
if machine is not None:
    report["cuda_raised"] = sorted(set(machine.cuda_calls()))
emit()
