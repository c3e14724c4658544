"""A real sampling workflow on a real ComfyUI tree, in a fresh interpreter.

    python sample_cases.py <comfyui-dir> <out-dir> --arch flux [--variants bf16,int8,w4a8,fp8]
                           [--lora] [--text-encoder bf16|fp32] [-- <ComfyUI flags>]

Builds a tiny, seeded, random checkpoint of a real architecture (the
architecture's own ComfyUI class gives the keys and shapes; ComfyUI's model
detection has to recognise it from the shapes alone), writes one safetensors
file per variant in ComfyUI 0.30's on-disk format (weights quantized with
comfy-kitchen's own layouts), loads each with ``comfy.sd.load_diffusion_model``
and runs a few steps of ``comfy.sample.sample`` with random conditioning, or
(MiniMax-H3 with ``--text-encoder``) with the conditioning ComfyUI's own
MiniMax-H3 text encoder gives: a tiny seeded Qwen3-VL-32B-structured checkpoint
(``tiny_text_encoder.py``) loaded with ``comfy.sd.load_clip``
(``CLIPType.MINIMAX``) and run as the CLIPTextEncode node does; the report's
``text_encoder`` entry says what ComfyUI built, where its weights sat while
encoding and the bed's counters meanwhile; the positive conditioning is saved
to ``<out-dir>/conditioning.pt``.

Prints one JSON object: per variant the stage reached (or the error, as the
user would see it), what was detected, where the weights sat while sampling,
the bed's counters (CPU fallbacks, NPU quant op calls, float8 tensors on the
device) and the latent's statistics; each latent is saved to
``<out-dir>/<variant>.pt`` for the test to compare against the CPU reference.
The assertions live in ``test_sampling.py``.
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
parser.add_argument("--arch", default="flux")
parser.add_argument("--variants", default="bf16,int8,w4a8,fp8")
parser.add_argument("--steps", type=int, default=3)
parser.add_argument("--lora", action="store_true", help="also sample the int8 model with a LoRA")
parser.add_argument("--fp32-check", action="store_true", help="also sample the fp32 weights (CPU)")
parser.add_argument("--count-step", action="store_true",
                    help="count the device ops of the last step's diffusion-model forward")
parser.add_argument("--text-encoder", choices=("bf16", "fp32"),
                    help="MiniMax-H3: condition on ComfyUI's own text encoder, its weights in this dtype")
parser.add_argument("--npu-schemas", metavar="FILE",
                    help="serve the fake torch_npu's RoPE ops as torch.ops packets with the schemas in FILE "
                         "(a real wheel's registered_schemas.txt), as upstream's ascend backend needs")
split = sys.argv.index("--") if "--" in sys.argv else len(sys.argv)
OPTS = parser.parse_args(sys.argv[1:split])
FLAGS = sys.argv[split + 1:]

log_stream = io.StringIO()
logging.basicConfig(level=logging.INFO, stream=log_stream, format="%(name)s %(levelname)s %(message)s")
report = {"flags": FLAGS, "arch": OPTS.arch, "variants": {}, "stand_ins": []}


def emit():
    report["seconds"] = round(time.monotonic() - START, 2)
    times = os.times()
    report["cpu_seconds"] = round(times.user + times.system, 2)  # on a shared box, wall time says little
    report["log"] = log_stream.getvalue().splitlines()[-60:]
    print(json.dumps(report, default=str))


def error_line(exc):
    text = str(exc).strip().splitlines()
    return "%s: %s" % (type(exc).__name__, text[0] if text else "")


# --------------------------------------------------------------------------- start ComfyUI

if OPTS.npu_schemas:  # before comfy-kitchen loads: its ascend backend reads the schemas at import
    import torch_npu

    from testbed import torch_ops_packets

    packets = torch_ops_packets.serve_from_file(torch_npu, OPTS.npu_schemas)
try:
    report["stand_ins"] = start_comfyui(OPTS.comfy_dir, FLAGS)
    import comfy.model_management as mm  # what main.py imports first; it picks the device
except BaseException as exc:  # the ASCEND_SHIM=0 leg: ComfyUI stops here
    report["startup"] = error_line(exc)
    emit()
    sys.exit(0)

import torch  # noqa: E402

import comfy.sample  # noqa: E402
import comfy.sd  # noqa: E402
import comfy.utils  # noqa: E402
import safetensors.torch  # noqa: E402
from comfy.quant_ops import QuantizedTensor  # noqa: E402

import tiny_models as models  # noqa: E402  (beside this script)
import tiny_text_encoder as text_encoder  # noqa: E402

try:
    from testbed import machine, npu_device
except ImportError:
    machine = npu_device = None
on_npu = machine is not None and machine.active() in ("ascend-cu130", "ascend-cpu") \
    and "torch_npu" in sys.modules
step_account = None
if OPTS.count_step and on_npu:  # device bytes of the counted step, beside its op counts
    from testbed import device_account

    step_account = device_account.Account().install()
report["startup"] = "ok"
report["device"] = str(mm.get_torch_device())
report["vram_state"] = mm.vram_state.name
report["torch"] = torch.__version__
if "ascend_shim.engine.runner" in sys.modules:
    import ascend_shim

    report["shim"] = {row["name"]: row["state"] for row in ascend_shim.status()["patches"]}


ACCOUNT = "ascend_shim.patches.comfyui.reports.attention_account"


def reset_counters():
    if on_npu:
        import torch_npu

        torch_npu._testbed.reset()
        npu_device.reset_cpu_fallbacks()
        npu_device.reset_dtype_findings()
    if ACCOUNT in sys.modules:
        sys.modules[ACCOUNT].take_prompt_line()  # a new "prompt": the account's per-prompt count restarts


def counters():
    if not on_npu:
        return {}
    import torch_npu

    account = sys.modules.get(ACCOUNT)
    return {"fallbacks": dict(npu_device.cpu_fallbacks()),
            "sdpa_paths": dict(torch_npu._testbed.sdpa_paths),
            "attention_line": account.take_prompt_line() if account else None,
            "quant_matmul": torch_npu._testbed.calls["npu_quant_matmul"],
            "dynamic_quant": torch_npu._testbed.calls["npu_dynamic_quant"],
            "errors": [list(e) for e in torch_npu._testbed.errors][:5],
            # calls outside torch_npu's documented dtype table (testbed/dtype_table.py): "silu/bfloat16"
            "dtype_findings": {"%s/%s" % key: n for key, n in sorted(npu_device.dtype_findings().items())}}


def tensors_of(module):
    """(name, tensor) of every parameter and buffer, quantized weights' inner tensors included."""
    for name, t in list(module.named_parameters()) + list(module.named_buffers()):
        if isinstance(t, QuantizedTensor):
            yield name, t._qdata
            params = t._params
            for field in params._tensor_fields():
                inner = getattr(params, field, None)
                if isinstance(inner, torch.Tensor):
                    yield name + "." + field, inner
        else:
            yield name, t


def placement(module):
    """Where the weights sit: tensors per device type, float8 tensors on a device."""
    where = {}
    float8 = []
    for name, t in tensors_of(module):
        where[t.device.type] = where.get(t.device.type, 0) + 1
        if t.device.type != "cpu" and t.dtype.itemsize == 1 and t.dtype.is_floating_point:
            float8.append(name)
    return {"devices": where, "float8_on_device": float8}


def layer_kinds(module):
    kinds = {}
    for name, t in module.named_parameters():
        if name.endswith(".weight"):
            kind = t._layout_cls if isinstance(t, QuantizedTensor) else str(t.dtype)
            kinds[kind] = kinds.get(kind, 0) + 1
    return kinds


def flat(t):
    """One CPU fp32 vector of a tensor, a nested tensor (video + audio) or a list of tensors."""
    if getattr(t, "is_nested", False):
        t = t.unbind()
    if isinstance(t, (list, tuple)):
        return torch.cat([flat(x) for x in t])
    return t.detach().float().cpu().flatten()


def first_tensor(x):
    return x if torch.is_tensor(x) and not getattr(x, "is_nested", False) else first_tensor(
        x.unbind()[0] if torch.is_tensor(x) else x[0])


def sample_once(patcher, spec, seed=7):
    """A few steps of ComfyUI's sampler; the weights' placement seen from inside the model."""
    diffusion_model = patcher.model.diffusion_model
    seen = {}
    forwards = []
    count_this = OPTS.count_step and on_npu

    def look(module, args):
        forwards.append(1)
        if not seen:
            seen.update(placement(module))
            if on_npu:
                seen["npu_bytes"] = npu_device.memory_allocated()
            seen["input_device"] = str(first_tensor(args[0]).device)
        if count_this and len(forwards) == OPTS.steps:  # the last step: whatever is built once is built
            import torch_npu

            seen["npu_ops_before"] = dict(torch_npu._testbed.calls)
            npu_device.reset_op_counts(enable=True)
            step_account.start()

    def keep_first_output(module, args, output):
        if "velocity" not in seen:  # the first step's prediction: same input in every run
            seen["velocity"] = flat(output)
        if count_this and len(forwards) == OPTS.steps:
            import torch_npu

            seen["step_aten_ops"] = dict(npu_device.op_counts())
            npu_device.reset_op_counts(enable=False)
            seen["step_bytes"] = sum(row[3] for row in step_account.stop())
            before = seen.pop("npu_ops_before")
            seen["step_npu_ops"] = {op: n - before.get(op, 0) for op, n in torch_npu._testbed.calls.items()
                                    if n - before.get(op, 0)}

    hook = diffusion_model.register_forward_pre_hook(look)
    hook_out = diffusion_model.register_forward_hook(keep_first_output)
    try:
        latent = spec.latent()
        noise = comfy.sample.prepare_noise(latent, seed)
        positive, negative = conditioning if OPTS.text_encoder else spec.conditioning(seed)
        out = comfy.sample.sample(patcher, noise, OPTS.steps, 1.0, "euler", "simple", positive, negative,
                                  latent, denoise=1.0, disable_pbar=True, seed=seed)
    finally:
        hook.remove()
        hook_out.remove()
    # what the model added: with a zero velocity the sampler would return the noise itself
    contribution = flat(out) - flat(patcher.model.process_latent_out(noise))
    return contribution, seen


def run_variant(name, make_state_dict, patch=None, model_options=None):
    # under inference_mode, as ComfyUI's executor runs every node (loaders and samplers): there
    # aten::linear reaches kitchen's QuantizedTensor whole; outside it decomposes, and a bias-free
    # 3-D linear becomes torch_npu's own aten::matmul kernel, which kitchen dequantizes for
    with torch.inference_mode():
        _run_variant(name, make_state_dict, patch, model_options)


def _run_variant(name, make_state_dict, patch=None, model_options=None):
    entry = report["variants"].setdefault(name, {})
    started = time.monotonic()
    path = os.path.join(OPTS.out_dir, "%s.safetensors" % name)
    try:
        entry["stage"] = "write"
        safetensors.torch.save_file(make_state_dict(), path)
        entry["stage"] = "load"
        reset_counters()
        patcher = comfy.sd.load_diffusion_model(path, model_options=model_options or {})
        entry["compute_dtype"] = str(patcher.model.get_dtype())
        entry["model_class"] = type(patcher.model).__name__
        entry["config"] = type(patcher.model.model_config).__name__
        entry["unet_config"] = {k: v for k, v in patcher.model.model_config.unet_config.items()
                                if isinstance(v, (int, float, str, bool))}
        entry["layers"] = layer_kinds(patcher.model.diffusion_model)
        if patch is not None:
            entry["stage"] = "lora"
            patcher = patch(patcher)
        entry["stage"] = "sample"
        if OPTS.text_encoder and conditioning is None:
            raise RuntimeError("no conditioning: the text encoder failed (see text_encoder)")
        reset_counters()
        out, seen = sample_once(patcher, spec)
        entry["counters"] = counters()
        entry["while_sampling"] = seen
        entry["stage"] = "done"
        entry["finite"] = bool(torch.isfinite(out).all())
        entry["std"] = float(out.std())
        entry["numel"] = out.numel()
        velocity = seen.pop("velocity")
        entry["velocity_std"] = float(velocity.std())
        torch.save({"latent": out, "velocity": velocity}, os.path.join(OPTS.out_dir, "%s.pt" % name))
        del patcher
        mm.unload_all_models()
    except BaseException as exc:
        entry["error"] = error_line(exc)
        entry["counters"] = counters()
    entry["seconds"] = round(time.monotonic() - started, 2)


def encode_prompts(dtype_name):
    """Load the tiny MiniMax-H3 text encoder as a user does and encode as CLIPTextEncode does."""
    entry = report["text_encoder"] = {"stage": "write"}
    started = time.monotonic()
    path = os.path.join(OPTS.out_dir, "text_encoder.safetensors")
    try:
        text_encoder.model_qwen3vl_32b_at_tiny_width()
        text_encoder.write(path, dtype_name)
        entry["stage"] = "load"
        logs_before = len(log_stream.getvalue().splitlines())
        clip = comfy.sd.load_clip([path], clip_type=comfy.sd.CLIPType.MINIMAX)
        entry["load_log"] = [line for line in log_stream.getvalue().splitlines()[logs_before:]
                             if "clip missing" in line or "clip unexpected" in line]
        entry.update(text_encoder.describe(clip, path))
        seen = {}

        def look(module, args, kwargs):
            if not seen:
                seen.update(placement(module))
                given = kwargs.get("embeds")  # SDClipModel passes the token embeddings
                seen["input_device"] = str(given.device) if torch.is_tensor(given) else None
                seen["input_dtype"] = str(given.dtype) if torch.is_tensor(given) else None  # the compute dtype

        hook = clip.cond_stage_model.qwen3vl_32b.transformer.register_forward_pre_hook(look, with_kwargs=True)
        entry["stage"] = "encode"
        reset_counters()
        encode_started = time.monotonic()
        try:
            positive, negative = text_encoder.encode(clip)
        finally:
            hook.remove()
        entry["encode_seconds"] = round(time.monotonic() - encode_started, 2)
        entry["counters"] = counters()
        entry["while_encoding"] = seen
        cond, extra = positive[0]
        entry["cond"] = {"shape": list(cond.shape), "dtype": str(cond.dtype), "device": str(cond.device),
                         "finite": bool(torch.isfinite(cond).all()), "mean": float(cond.float().mean()),
                         "std": float(cond.float().std())}
        entry["cond_keys"] = sorted(extra)
        entry["negative_shape"] = list(negative[0][0].shape)
        entry["token_tags"] = extra["minimax_token_tags"].tolist() if "minimax_token_tags" in extra else None
        torch.save({"positive": cond.detach().float().cpu(), "negative": negative[0][0].detach().float().cpu()},
                   os.path.join(OPTS.out_dir, "conditioning.pt"))
        entry["stage"] = "done"
        del clip
        mm.unload_all_models()
        return positive, negative
    except BaseException as exc:
        entry["error"] = error_line(exc)
        entry["counters"] = counters()
        return None
    finally:
        entry["seconds"] = round(time.monotonic() - started, 2)


spec = models.SPECS[OPTS.arch](seed=0)
conditioning = None
if OPTS.text_encoder:
    if OPTS.arch != "minimax":
        parser.error("--text-encoder is MiniMax-H3's (Qwen3-VL-32B) encoder")
    conditioning = encode_prompts(OPTS.text_encoder)
master = spec.build()  # fp32 state dict, on the CPU
report["parameters"] = sum(t.numel() for t in master.values())
report["quantized_layers"] = sum(1 for k, t in master.items() if spec.quantized(k, t))
report["build_seconds"] = round(time.monotonic() - START, 2)

if OPTS.fp32_check:  # the numerical check of the random model: bf16 against fp32, on the CPU
    run_variant("fp32", lambda: master, model_options={"dtype": torch.float32})
    run_variant("bf16_compute", lambda: models.checkpoint(master, spec, "bf16"),
                model_options={"dtype": torch.bfloat16})
for variant in OPTS.variants.split(","):
    run_variant(variant, lambda: models.checkpoint(master, spec, variant))
if OPTS.lora:
    lora = models.lora_for(master, spec, seed=1)

    def with_lora(patcher):
        patched, _ = comfy.sd.load_lora_for_models(patcher, None, lora, 1.0, 0.0)
        report["variants"]["int8_lora"]["lora_patches"] = len(patched.patches)
        return patched

    run_variant("int8_lora", lambda: models.checkpoint(master, spec, "int8"), patch=with_lora)
if machine is not None:
    report["cuda_raised"] = sorted(set(machine.cuda_calls()))
emit()
