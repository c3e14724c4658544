"""ComfyUI's own MultiGPU on simulated NPUs, in a fresh interpreter (issue 27).

    python multigpu_cases.py <comfyui-dir> <out-dir> [--archs flux,minimax] [--cards 1,2,4]
                             [--steps 2] [--select] [--oom] [-- <ComfyUI flags>]

On a bed with ``TESTBED_NPU_COUNT`` cards: builds the tiny seeded int8 checkpoints of
``tiny_models.py``, loads each with ``comfy.sd.load_diffusion_model`` (the UNETLoader's
loader, which MultiGPU can deep-clone) and samples with CFG on two prompts (four work units:
two positive, two negative entries) on one card, then through ``MultiGPU CFG Split``
(``comfy.multigpu.create_multigpu_deepclones``, what the node runs) on 2 and 4 cards. Per
run: every diffusion-model call's thread, that thread's current NPU (the bed's per-thread
device, as ACL's), its input's card and batch; the bed's op counts and torch_npu op calls
per card, CPU fallbacks, threads bound to card 0 without asking; wall time; the latent,
compared with the one-card run of the same batches (2 cards: each card gets 2 of the 4 work
units, as one card batches them; 4 cards: one each, the "1b1" run, where ComfyUI is told
there is no room for more than one per call).

``--select``: the device-selection nodes (SelectVAEDevice, SelectCLIPDevice: ``gpu:1``) on a
tiny TAESD VAE and the tiny MiniMax-H3 text encoder: where each computes and which card is
current meanwhile. ``--oom``: a VAE decode on card 1 meets torch_npu's own out-of-memory
error once (a state the bed cannot reach: the decode is made to raise it), ComfyUI's
decision on it, and ``is_oom`` on other errors. Prints one JSON object.
"""

import argparse
import io
import json
import logging
import os
import sys
import threading
import time

from comfyui_start import start_comfyui

parser = argparse.ArgumentParser()
parser.add_argument("comfy_dir")
parser.add_argument("out_dir")
parser.add_argument("--archs", default="flux,minimax")
parser.add_argument("--cards", default="1,1b1,2,4",
                    help="runs: N cards; 1b1 = one card, one prompt half per model call (the batch a card "
                         "gets on 4 cards)")
parser.add_argument("--steps", type=int, default=2)
parser.add_argument("--select", action="store_true")
parser.add_argument("--oom", action="store_true")
split = sys.argv.index("--") if "--" in sys.argv else len(sys.argv)
OPTS = parser.parse_args(sys.argv[1:split])
FLAGS = sys.argv[split + 1:]

log_stream = io.StringIO()
logging.basicConfig(level=logging.INFO, stream=log_stream, format="%(name)s %(levelname)s %(message)s")
report: dict = {"runs": {}}
start_comfyui(OPTS.comfy_dir, FLAGS)
import comfy.model_management as mm  # noqa: E402
import torch  # noqa: E402
import torch_npu  # noqa: E402

import comfy.model_patcher  # noqa: E402
import comfy.multigpu  # noqa: E402
import comfy.sample  # noqa: E402
import comfy.sd  # noqa: E402
import safetensors.torch  # noqa: E402
from testbed import npu_device  # noqa: E402

import tiny_models as models  # noqa: E402

report["device"] = str(mm.get_torch_device())
report["all_devices"] = [str(d) for d in mm.get_all_torch_devices()]
if "ascend_shim.engine.runner" in sys.modules:
    import ascend_shim

    report["shim"] = {row["name"]: row["state"] for row in ascend_shim.status()["patches"]}


def error_line(exc):
    text = str(exc).strip().splitlines()
    return "%s: %s" % (type(exc).__name__, text[0] if text else "")


def reset():
    torch_npu._testbed.reset()
    npu_device.reset_cpu_fallbacks()
    npu_device.reset_implicit_binds()
    npu_device.reset_op_counts(enable=True)


def per_card():
    """Device work since reset(): aten ops and torch_npu op calls per card, CPU fallbacks."""
    ops: dict = {}
    for (index, _name), n in npu_device.op_counts_by_device().items():
        ops[str(index)] = ops.get(str(index), 0) + n
    npu_ops: dict = {}
    for (device, op), n in torch_npu._testbed.device_calls.items():
        npu_ops.setdefault(str(device), {})[op] = n
    npu_device.reset_op_counts(enable=False)
    return {"aten_ops": ops, "npu_ops": npu_ops, "fallbacks": dict(npu_device.cpu_fallbacks()),
            "implicit_binds": npu_device.implicit_binds()}


def conditioning(spec):
    """Two prompts with CFG: four work units, one per card on 4 cards."""
    pos_a, neg_a = spec.conditioning(1)
    pos_b, _ = spec.conditioning(2)
    neg_b = [[pos_b[0][0] * 0.5, dict(pos_b[0][1])]]
    return pos_a + pos_b, neg_a + neg_b


def watch(patchers, calls):
    """Forward pre-hooks on every clone's diffusion model: which thread ran it on which card."""
    def look(module, args):
        x = args[0]
        while isinstance(x, (list, tuple)) or getattr(x, "is_nested", False):  # video + audio latents
            x = x[0] if isinstance(x, (list, tuple)) else x.unbind()[0]
        calls.append({"thread": threading.current_thread().name, "thread_card": npu_device.thread_device(),
                      "input": str(x.device), "batch": int(x.shape[0])})

    return [p.model.diffusion_model.register_forward_pre_hook(look) for p in patchers]


def sample_on(arch, patcher, run, spec, reference):
    entry = report["runs"].setdefault(arch, {}).setdefault(run, {})
    cards = int(run.partition("b")[0])
    one_per_call = run.endswith("b1")
    free_memory = comfy.model_patcher.ModelPatcher.get_free_memory
    try:
        model = patcher if cards == 1 else comfy.multigpu.create_multigpu_deepclones(patcher, cards)
        if one_per_call:  # no room for two: _calc_cond_batch sends one work unit per model call
            comfy.model_patcher.ModelPatcher.get_free_memory = lambda self, device: 0
        clones = model.get_additional_models_with_key("multigpu")
        entry["clone_devices"] = [str(c.load_device) for c in clones]
        calls: list = []
        hooks = watch([model] + clones, calls)
        positive, negative = conditioning(spec)
        latent = spec.latent()
        noise = comfy.sample.prepare_noise(latent, 7)
        reset()
        started = time.perf_counter()
        try:
            out = comfy.sample.sample(model, noise, OPTS.steps, 2.0, "euler", "simple", positive, negative,
                                      latent, denoise=1.0, disable_pbar=True, seed=7)
        finally:
            entry["seconds"] = round(time.perf_counter() - started, 3)
            comfy.model_patcher.ModelPatcher.get_free_memory = free_memory
            for h in hooks:
                h.remove()
        entry.update(per_card())
        entry["calls"] = calls
        out = torch.cat([t.flatten() for t in out.unbind()]) if getattr(out, "is_nested", False) else out
        out = out.float().cpu()
        entry["finite"] = bool(torch.isfinite(out).all())
        if reference is not None:
            a, b = out.flatten(), reference.flatten()
            entry["max_abs_diff"] = float((a - b).abs().max())
            entry["cosine"] = float(torch.nn.functional.cosine_similarity(a, b, dim=0))
        return out
    except BaseException as exc:
        comfy.model_patcher.ModelPatcher.get_free_memory = free_memory
        entry["error"] = error_line(exc)
        return None


def run_arch(arch):
    spec = models.SPECS[arch](seed=0)
    master = spec.build()
    path = os.path.join(OPTS.out_dir, "%s_int8.safetensors" % arch)
    safetensors.torch.save_file(models.checkpoint(master, spec, "int8"), path)
    patcher = comfy.sd.load_diffusion_model(path)
    outputs: dict = {}
    for run in OPTS.cards.split(","):
        reference = {"2": outputs.get("1"), "4": outputs.get("1b1")}.get(run)
        outputs[run] = sample_on(arch, patcher, run, spec, reference)
    mm.unload_all_models()


def tiny_vae():
    import comfy.taesd.taesd
    import folder_paths
    import nodes

    # ComfyUI's TAESD layers skip weight init: the keys and shapes, seeded values of our own
    shapes = {k: v.shape for k, v in comfy.taesd.taesd.TAESD(latent_channels=16).state_dict().items()}
    gen = torch.Generator().manual_seed(5)
    weights = {k: (torch.ones(shape) if k == "vae_scale" else torch.zeros(shape) if k == "vae_shift"
                   else torch.randn(shape, generator=gen) * 0.05) for k, shape in shapes.items()}
    folder = os.path.join(OPTS.out_dir, "vae")
    os.makedirs(folder, exist_ok=True)
    safetensors.torch.save_file(weights, os.path.join(folder, "tiny_taesd.safetensors"))
    folder_paths.add_model_folder_path("vae", folder)
    return nodes.VAELoader().load_vae("tiny_taesd.safetensors")[0]


def decode_watch(vae):
    seen: list = []

    def look(module, args):
        seen.append({"thread_card": npu_device.thread_device(), "input": str(args[0].device)})

    return seen, vae.first_stage_model.taesd_decoder.register_forward_pre_hook(look)


def select_nodes():
    from comfy_extras import nodes_multigpu

    out = report["select"] = {"options": mm.get_gpu_device_options()}
    latent = torch.randn(1, 16, 8, 8, generator=torch.Generator().manual_seed(3))
    try:
        vae = tiny_vae()
        out["vae_default_device"] = str(vae.device)
        seen, hook = decode_watch(vae)
        reset()
        before = npu_device.thread_device()
        on_default = vae.decode(latent).detach().float().cpu()
        hook.remove()
        out["vae_default"] = dict(per_card(), seen=seen)
        moved = nodes_multigpu.SelectVAEDeviceNode.execute(vae, "gpu:1")[0]
        out["vae_selected_device"] = str(moved.device)
        seen, hook = decode_watch(moved)
        reset()
        on_card1 = moved.decode(latent).detach().float().cpu()
        hook.remove()
        out["vae_selected"] = dict(per_card(), seen=seen)
        out["vae_thread_card_after"] = npu_device.thread_device()
        out["vae_thread_card_before"] = before
        out["vae_finite"] = [bool(torch.isfinite(on_default).all()), bool(torch.isfinite(on_card1).all())]
        out["vae_max_abs_diff"] = float((on_card1 - on_default).abs().max())
        report["_vae"] = moved
    except BaseException as exc:
        out["vae_error"] = error_line(exc)
    try:
        import tiny_text_encoder as text_encoder

        text_encoder.model_qwen3vl_32b_at_tiny_width()
        path = os.path.join(OPTS.out_dir, "text_encoder.safetensors")
        text_encoder.write(path, "bf16")
        clip = comfy.sd.load_clip([path], clip_type=comfy.sd.CLIPType.MINIMAX)
        reset()
        default_cond = text_encoder.encode(clip)[0][0][0].float().cpu()
        out["clip_default"] = per_card()
        moved = nodes_multigpu.SelectCLIPDeviceNode.execute(clip, "gpu:1")[0]
        out["clip_selected_device"] = str(moved.patcher.load_device)
        seen: list = []
        hook = moved.cond_stage_model.qwen3vl_32b.transformer.register_forward_pre_hook(
            lambda module, args, kwargs: seen.append({"thread_card": npu_device.thread_device()}), with_kwargs=True)
        reset()
        cond = text_encoder.encode(moved)[0][0][0].float().cpu()
        hook.remove()
        out["clip_selected"] = dict(per_card(), seen=seen[:1])
        out["clip_max_abs_diff"] = float((cond - default_cond).abs().max())
    except BaseException as exc:
        out["clip_error"] = error_line(exc)


OOM_TEXT = ("NPU out of memory. Tried to allocate 2.00 GiB (NPU 1; 60.96 GiB total capacity; 58.10 GiB already "
            "allocated; 58.10 GiB current active; 1.02 GiB free; 59.40 GiB reserved in total by PyTorch) If reserved "
            "memory is >> allocated memory try setting max_split_size_mb to avoid fragmentation.")
ACL_TEXT = ("operator():build/CMakeFiles/torch_npu.dir/compiler_depend.ts:128 NPU function error: call aclnnMatmul "
            "failed, error code is 207001\n[ERROR] 2026-12-03-05:00:00 (PID:1, Device:1, RankID:-1) ERR00100 PTA "
            "call acl api failed\n[Error]: Failed to apply for memory.\nEL0004: [PID: 1] Failed to allocate memory.")
# older op-plugin builds: ACL's message after "detail:" on the first line
DETAIL_TEXT = ("call aclnnCast failed, detail:EL0004: [PID: 1] 2026-12-03-05:00:00.000.000 Failed to allocate memory.\n"
               "        Possible Cause: Available memory is insufficient.\n"
               "        Solution: Close applications not in use.")


def decode_once_out_of_memory(vae, key, text, out):
    """A VAE decode whose first try raises RuntimeError(text): out[key] is its outcome,
    out[key + "_log"] ComfyUI's memory lines meanwhile."""
    decoder = vae.first_stage_model
    real_decode = decoder.decode
    raised: list = []

    def decode(*args, **kwargs):
        if not raised:
            raised.append(1)
            raise RuntimeError(text)
        return real_decode(*args, **kwargs)

    decoder.decode = decode
    logs_before = len(log_stream.getvalue().splitlines())
    try:
        pixels = vae.decode(torch.randn(1, 16, 8, 8))
        out[key] = "ok %s" % list(pixels.shape)
    except BaseException as exc:
        out[key] = error_line(exc)
    finally:
        decoder.decode = real_decode
    out[key + "_log"] = [line for line in log_stream.getvalue().splitlines()[logs_before:]
                         if "memory" in line.lower()]


def oom_cases():
    out = report["oom"] = {}
    vae = report.pop("_vae", None)
    if vae is not None:
        for key, text in (("decode", OOM_TEXT), ("decode_detail", DETAIL_TEXT)):
            decode_once_out_of_memory(vae, key, text, out)
    try:
        mm.is_oom(RuntimeError(OOM_TEXT))
        out["summary_first_lines"] = mm.debug_memory_summary().splitlines()[:2]
    except BaseException as exc:
        out["summary_first_lines"] = [error_line(exc)]
    errors = {
        "allocator_runtime_error": RuntimeError(OOM_TEXT),
        "acl_207001": RuntimeError(ACL_TEXT),
        "torch_out_of_memory": torch.OutOfMemoryError("NPU out of memory. Tried to allocate 1 GiB (NPU 0; ...)"),
        "value_error_quoting_oom": ValueError(OOM_TEXT),
        "runtime_error_quoting_oom": RuntimeError("loading the LoRA failed: the log said " + OOM_TEXT),
        "shape_error": RuntimeError("mat1 and mat2 shapes cannot be multiplied (4x8 and 16x4)"),
        "acl_other_code": RuntimeError(ACL_TEXT.replace("207001", "507035").replace("EL0004", "EZ9999")
                                       .replace("Failed to allocate memory.", "kernel failed.")),
        "aclnn_detail_el0004": RuntimeError(DETAIL_TEXT),
        "aclnn_detail_ez9999": RuntimeError("call aclnnCast failed, detail:EZ9999: Inner Error!\nEZ9999  Cannot "
                                            "parse json for config file [cast.json]."),
    }
    out["is_oom"] = {name: bool(mm.is_oom(exc)) for name, exc in errors.items()}


try:
    for arch in OPTS.archs.split(","):
        if arch:
            run_arch(arch)
    if OPTS.select or OPTS.oom:
        select_nodes()
    if OPTS.oom:
        oom_cases()
except BaseException as exc:
    report["error"] = error_line(exc)
report.pop("_vae", None)
report["log"] = [line for line in log_stream.getvalue().splitlines() if "multigpu" in line.lower()
                 or "memory" in line.lower() or "error" in line.lower()][-30:]
print(json.dumps(report, default=str))
