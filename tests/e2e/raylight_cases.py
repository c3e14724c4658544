"""One video on several simulated NPUs through raylight's own nodes, in a ComfyUI process.

    python raylight_cases.py <comfyui-dir> <raylight-dir> <out-dir> --cards 4
                             [--arch minimax,wan] [--parallel-arch minimax] [--variant int8]
                             [--steps 2] [--heads 4] [--sampler euler] [--text-tokens 12]
                             [--minimax-av 128,128,5] [--wan-frames 2,8,8]
                             [--cases reference,ray2,ray4,...]

This process is ComfyUI's: it starts ComfyUI's model code as main.py does, loads raylight
with ComfyUI's own custom-node loader (``nodes.load_custom_node``), writes a tiny seeded
checkpoint of a real architecture (``tiny_models.py``) where ComfyUI finds diffusion models,
and runs the cases asked for, in order, each architecture of ``--arch`` in turn:

  reference   ComfyUI's own UNETLoader + KSamplerAdvanced on one card, the latent saved as
              ``reference-<arch>.pt``
  rayN        RayInitializer (N workers, Ulysses degree N, ring 1, raylight's default attention
              and its HCCL self-test), then for each architecture on those workers RayUNETLoader ->
              XFuserKSamplerAdvanced, the latent saved as ``rayN-<arch>.pt``, and (MiniMax-H3) the
              video VAE decodes it here (VAEDecode); each worker reports its card, its ops and
              collectives (the bed's counters) per architecture; then RayKill. Right after
              RayInitializer returns: what raylight's HCCL self-test left behind (comm_test below)
  rayN@a+b    the same through RayInitializerAdvanced with GPU_SELECT "a,b" (the cards to use)
  ringR[xU]   the same as rayN with ring degree R (and Ulysses degree U, default 1) on R x U
              workers, the latent saved as ``ringR[xU]-<arch>.pt``; ``ring2x2`` then loads, on the same
              workers, a MiniMax-H3 of 6 heads (which Ulysses 4 cannot split) and saves
              ``ring2x2-minimax6.pt``; ``reference`` then also samples that model on one card
              (``reference-minimax6.pt``)
  fsdpN       the same as rayN with raylight's FSDP on (Ulysses N over the same N workers, the
              weights sharded by fully_shard, skip_comm_test), the latent saved as ``fsdpN-<arch>.pt``;
              each worker also reports the bytes of the model's parameters it holds, per device
  fsdpNcpu    the same with FSDP_CPU_OFFLOAD
  fsdpN-bf16  FSDP on N workers (right after ``fsdpN``: its workers, which switch checkpoints) of the
              bf16 checkpoint of each architecture, which raylight loads
              on worker 0 alone and broadcasts (``set_model_state_dict(..., broadcast_from_rank0)``),
              saved as ``fsdpN-bf16-<arch>.pt``, beside ComfyUI's one-card latent of the same
              checkpoint, ``reference-bf16-<arch>.pt``, and its weights' bytes
  fsdpNcpu-short  the same with ComfyUI's --reserve-vram beyond the card (raylight hands it to its
              workers): ComfyUI has no room for the weights on the card
  ring_misfit ring 2 x Ulysses 2 asked of 2 workers: raylight's own refusal, before any worker
  heads       right after ``ray4`` (its workers): a MiniMax-H3 of 6 heads, which Ulysses 4 cannot
              split: one clear error, then RayKill
  too_many    twice as many workers as cards: raylight's own refusal, counted on the NPUs
  gpu_cluster a Ray cluster started with GPUs and no NPU: refused when the workers are asked
              for, not a hang
  cfg2        Wan 2.1 with a negative prompt and cfg 5 on 2 workers of ``cfg_degree`` 2 (Ulysses 1, ring 1):
              each card runs the forward of one half of the CFG batch, the halves meet over HCCL's
              all-gather; the latent saved as ``cfg2-wancfg.pt`` (``reference`` then also samples
              that workflow on one card: ``reference-wancfg.pt``)
  cfgCxU      the same on C x U workers of ``cfg_degree`` C and Ulysses degree U: each half of the CFG
              batch split over U cards by Ulysses, saved as ``cfgCxU-wancfg.pt``
  dp2         data parallel: DPKSamplerAdvanced on 2 workers (Ulysses, ring and CFG degree 0), one Wan 2.1
              video per card, seeds 42 and 43 (DPNoiseList), saved as ``dp2-wanseed<seed>.pt``
              (``reference`` then also samples seed 43 on one card: ``reference-wanseed43.pt``)
  gguf2       a tiny Wan 2.1 written as a Q8_0 .gguf (the gguf package's writer) through raylight's
              RayGGUFLoader (registered by a ComfyUI-GGUF folder beside a copy of raylight's in this
              run's custom_nodes) -> XFuserKSamplerAdvanced on 2 workers (Ulysses 2; right after
              ``lora2``: its workers), saved as ``gguf2-wan.pt``; ComfyUI's UNETLoader + KSamplerAdvanced
              on one card of the gguf package's dequantized weights (``reference-gguf-dequantized-wan.pt``)
              and of the unquantized ones (``reference-gguf-fp32-wan.pt``)
  vae_decode  right after a rayN case (its workers): a seeded Wan 2.1 latent of 3 x 16 x 16 decoded by
              raylight's RayVAEDecodeDistributed over the workers and by ComfyUI's VAEDecodeTiled here
              on one card, the same tiles (64 px, overlap 32; temporal overlap 4, then the default 8);
              each process records the tiles its Wan VAE decoded (shape, a digest of the latent tile
              and one of its pixels, whether autograd recorded it), asked afterwards
  minimax_decode  right after a rayN case or ``vae_decode`` (their workers): a seeded MiniMax-H3 video latent
              of 12 x 24 x 24 (39 frames of 384 x 384, which that VAE, tiling itself, decodes as 8 tiles)
              decoded by RayVAEDecodeDistributed over the workers and by ComfyUI's VAEDecode here on one
              card; each process records the tile calls it computed and its ops
  lora_cached raylight's cached base model (2 cards, Ulysses 2): MiniMax-H3 sampled without a LoRA, then the same
              model with a LoRA on the same workers; each worker's card memory and whether it read the file again
  dead_ring   right after a ring case (its workers): the last worker's process ends inside its first ring
              step's attention; the sampler's error, RayKill, and the other workers' processes gone
  dead_worker right after ``ray2``, ``vae_decode`` or ``minimax_decode`` (their workers, a model loaded): one
              worker dies (after ``minimax_decode``: its process ends in its first tile of a distributed
              decode, the node's error), the sampler's error, ComfyUI lives on, RayKill frees the cards

Ray counts the cards with CANN's ``acl`` module (the bed's fake one reads
ASCEND_RT_VISIBLE_DEVICES as ACL does) and gives each worker one card in
ASCEND_RT_VISIBLE_DEVICES, which the bed's torch_npu reads. Prints one JSON object; the assertions live in test_raylight.py.
"""

import argparse
import asyncio
import glob
import io
import json
import logging
import os
import re
import sys
import time

from comfyui_start import start_comfyui

START = time.monotonic()
parser = argparse.ArgumentParser()
parser.add_argument("comfy_dir")
parser.add_argument("raylight_dir")
parser.add_argument("out_dir")
parser.add_argument("--cards", type=int, default=4, help="cards on the bed (the Ray cluster's NPUs)")
parser.add_argument("--arch", default="minimax", help="comma-separated: minimax, wan")
parser.add_argument("--parallel-arch", default=None,
                    help="the architectures of --arch the rayN, ringR and fsdpN cases sample (default: all)")
parser.add_argument("--variant", default="int8")
parser.add_argument("--steps", type=int, default=2)
parser.add_argument("--heads", type=int, default=4)
parser.add_argument("--minimax-av", default="128,128,5",
                    help="MiniMax-H3's EmptyMiniMaxH3LatentAV width,height,length")
parser.add_argument("--wan-frames", default="2,8,8", help="Wan's latent frames,height,width")
parser.add_argument("--head-dim", type=int, default=128, help="MiniMax-H3's attention head size")
parser.add_argument("--text-tokens", type=int, default=12, help="the prompt's tokens (MiniMax-H3)")
parser.add_argument("--sampler", default="euler")
parser.add_argument("--template", action="store_true",
                    help="sample through the custom-sampling template: one card's BasicGuider + SamplerCustomAdvanced, "
                         "the workers' RayBasicGuider + XFuserSamplerCustomAdvanced, the same sigmas (BasicScheduler)")
parser.add_argument("--cases", default="reference,ray2")
OPTS = parser.parse_args()
CASES = OPTS.cases.split(",")

log_stream = io.StringIO()
logging.basicConfig(level=logging.INFO, stream=log_stream, format="%(name)s %(levelname)s %(message)s")
report = {"cases": {}, "stand_ins": []}


def emit():
    report["seconds"] = round(time.monotonic() - START, 2)
    report["log"] = [line for line in log_stream.getvalue().splitlines() if "raylight" in line.lower()][-40:]
    print(json.dumps(report, default=str))


def error_line(exc):
    text = str(exc).strip().splitlines()
    return "%s: %s" % (type(exc).__name__, text[0] if text else "")


def error_text(exc):
    """The whole message, as ComfyUI's console shows it (a Ray error holds the worker's traceback)."""
    return "%s: %s" % (type(exc).__name__, str(exc))


# --------------------------------------------------------------------------- start ComfyUI

report["stand_ins"] = start_comfyui(OPTS.comfy_dir)
import comfy.model_management as mm  # noqa: E402
import torch  # noqa: E402

import folder_paths  # noqa: E402
import nodes  # noqa: E402
import safetensors.torch  # noqa: E402

import tiny_models as models  # noqa: E402  (beside this script)
from tiny_models import flat  # noqa: E402
import tiny_vaes as vaes  # noqa: E402

report["device"] = str(mm.get_torch_device())
import ascend_shim  # noqa: E402

MODELS = os.path.join(OPTS.out_dir, "models")
os.makedirs(MODELS, exist_ok=True)
folder_paths.add_model_folder_path("diffusion_models", MODELS)
folder_paths.add_model_folder_path("vae", MODELS)
folder_paths.add_model_folder_path("loras", MODELS)

RAYLIGHT_DIR = os.path.realpath(OPTS.raylight_dir)
if "gguf2" in CASES:
    # raylight registers RayGGUFLoader (its vendored copy of city96's loader) only where a folder
    # ComfyUI-GGUF sits beside its own (its __init__.py, by the real path of that file): here a
    # custom_nodes folder of this run models a user's install, raylight's folder (a copy: a link
    # would resolve to the cache) beside an empty ComfyUI-GGUF standing for the user's installed node
    import shutil

    custom_nodes = os.path.join(OPTS.out_dir, "custom_nodes")
    shutil.copytree(RAYLIGHT_DIR, os.path.join(custom_nodes, "raylight"),
                    ignore=shutil.ignore_patterns("__pycache__", "_ray_runtime_env"))
    os.makedirs(os.path.join(custom_nodes, "ComfyUI-GGUF"))
    RAYLIGHT_DIR = os.path.join(custom_nodes, "raylight")
loaded = asyncio.run(nodes.load_custom_node(RAYLIGHT_DIR))
report["raylight_loaded"] = loaded
if not loaded:
    emit()
    sys.exit(0)
RAY = {name: nodes.NODE_CLASS_MAPPINGS[name] for name in
       ("RayInitializer", "RayInitializerAdvanced", "RayUNETLoader", "XFuserKSamplerAdvanced", "RayKill",
        "RayVAEDecodeDistributed", "DPKSamplerAdvanced", "DPNoiseList", "RayLoraLoader")}


def shim_rows(prefix=("raylight", "yunchang")):
    return {row["name"]: [row["state"], row.get("detail", "")] for row in ascend_shim.status()["patches"]
            if row["name"].startswith(prefix)}


report["driver_patches"] = shim_rows()

# --------------------------------------------------------------------------- the workflow's inputs

ARCHS = OPTS.arch.split(",")
PARALLEL_ARCHS = OPTS.parallel_arch.split(",") if OPTS.parallel_arch else ARCHS
UNETS, SAMPLINGS = {}, {}


def spec_of(arch, heads):
    """The tiny model of ``arch`` at this run's sizes (``--minimax-av``, ``--text-tokens``, ``--wan-frames``)."""
    if arch == "minimax":
        return models.SPECS[arch](seed=0, heads=heads, av=[int(n) for n in OPTS.minimax_av.split(",")],
                                  text_tokens=OPTS.text_tokens, head_dim=OPTS.head_dim)
    if arch == "wan":
        return models.SPECS[arch](seed=0, heads=heads, frames=[int(n) for n in OPTS.wan_frames.split(",")])
    return models.SPECS[arch](seed=0, heads=heads)


for arch in ARCHS:
    spec = spec_of(arch, OPTS.heads)
    UNETS[arch] = "tiny_%s_%s_%dheads.safetensors" % (arch, OPTS.variant, OPTS.heads)
    safetensors.torch.save_file(models.checkpoint(spec.build(), spec, OPTS.variant), os.path.join(MODELS, UNETS[arch]))
    positive, negative = spec.conditioning(seed=3)
    SAMPLINGS[arch] = dict(add_noise="enable", noise_seed=42, steps=OPTS.steps, cfg=1.0, sampler_name=OPTS.sampler,
                           scheduler="simple", positive=positive, negative=negative,
                           latent_image={"samples": spec.latent()}, start_at_step=0, end_at_step=10000,
                           return_with_leftover_noise="disable")
UNET, SAMPLING = UNETS[ARCHS[0]], SAMPLINGS[ARCHS[0]]  # what the bad-input cases load
if "wan" in ARCHS:  # a CFG workflow: a negative prompt of its own, guidance 5
    negative = torch.randn(1, 12, 4096, generator=torch.Generator().manual_seed(7)) * 0.1
    SAMPLINGS["wancfg"] = dict(SAMPLINGS["wan"], cfg=5.0, negative=[[negative, {}]])
    UNETS["wancfg"] = UNETS["wan"]
INIT = dict(ray_cluster_address="local", ray_cluster_namespace="default", GPU=2,
            ulysses_degree=2, ring_degree=1, cfg_degree=1, dp_degree=1, sync_ulysses=False,
            clear_vram_after_sampling=False, FSDP=False, FSDP_CPU_OFFLOAD=False, XFuser_attention="TORCH_FLASH",
            skip_comm_test=False, use_mmap=False)


def worker_view(actor):
    """What one Ray worker saw, asked inside it: its card, its ops, its collectives."""

    def look(worker):
        import sys as _sys

        import torch as _torch

        out = {"pid": os.getpid(), "ascend_rt_visible_devices": os.environ.get("ASCEND_RT_VISIBLE_DEVICES")}
        try:
            from testbed import npu_device as nd

            out["count"] = _torch.npu.device_count()
            out["physical"] = [nd.physical_id(i) for i in range(out["count"])]
            out["cpu_fallbacks"] = dict(nd.cpu_fallbacks())
            out["ops_on_cards"] = sorted({nd.physical_id(i) for (i, _), n in nd.op_counts_by_device().items()
                                          if i is not None and n})
            import torch_npu as _npu

            out["quant_matmul"] = _npu._testbed.calls["npu_quant_matmul"]
            out["dynamic_quant"] = _npu._testbed.calls["npu_dynamic_quant"]
            out["sdpa_paths"] = dict(_npu._testbed.sdpa_paths)
            out["fusion_attention"] = _npu._testbed.calls["npu_fusion_attention"]
            keys = {}  # the keys each ring step attended to (BSND: key.shape[1]), counted
            for call in _npu._testbed.records_for("npu_fusion_attention"):
                length = str(call.tensors["key"].shape[1])
                keys[length] = keys.get(length, 0) + 1
            out["attention_keys"] = keys
            hccl = _sys.modules.get("testbed.hccl")
            if hccl is not None:  # per kind of collective this worker issued: calls, bytes sent/received
                out["collectives"] = {kind: counts for (_card, kind), counts in hccl.collective_bytes().items()}
            out["weights"], out["int8_weight_bytes"] = resident_weights(worker)
            out["load_device"] = str(getattr(getattr(worker, "model", None), "load_device", None))
        except Exception as exc:  # noqa: BLE001
            out["error"] = error_line(exc)
        import ascend_shim as _shim

        out["patches"] = {row["name"]: row["state"] for row in _shim.status()["patches"]
                          if row["name"].startswith(("raylight", "yunchang", "is_nvidia", "kitchen"))}
        return out

    import ray

    return ray.get(actor.__ray_call__.remote(look), timeout=120)


def resident_weights(worker):
    """Bytes of the diffusion model's parameters this worker holds, per device type ("npu", "cpu",
    "meta"), and how many of them are int8 data: an FSDP parameter counts its local shard
    (``DTensor._local_tensor``), an int8 one its quantized data and the tensors of its
    parameters (scales)."""
    import dataclasses

    import torch as _torch

    patcher = getattr(worker, "model", None)
    base = getattr(patcher, "model", patcher)
    model = getattr(base, "diffusion_model", None)
    held: dict = {}
    int8 = 0
    if model is None:
        return held, int8

    def add(tensor):
        held[tensor.device.type] = held.get(tensor.device.type, 0) + tensor.numel() * tensor.element_size()

    for param in model.parameters():
        local = getattr(param, "_local_tensor", None)
        tensor = local if local is not None else param
        if hasattr(tensor, "_qdata"):  # comfy-kitchen's QuantizedTensor
            add(tensor._qdata)
            if tensor._qdata.dtype == _torch.int8:
                int8 += tensor._qdata.numel()
            params = tensor._params
            values = ([getattr(params, f.name) for f in dataclasses.fields(params)]
                      if dataclasses.is_dataclass(params) else list(vars(params).values()))
            for value in values:
                if isinstance(value, _torch.Tensor):
                    add(value)
        else:
            add(tensor)
    return held, int8


def start_counting(actor):
    def reset(worker):
        from testbed import npu_device as nd

        nd.reset_op_counts(enable=True)
        nd.reset_cpu_fallbacks()
        import sys as _sys

        import torch_npu as _npu

        _npu._testbed.reset()
        hccl = _sys.modules.get("testbed.hccl")
        if hccl is not None:
            hccl.reset_collective_bytes()
        return True

    import ray

    return ray.get(actor.__ray_call__.remote(reset), timeout=120)


COMM_LINE = re.compile(r"^\[Rank (\d+)\] COMM test passed \u2705 \(result=(.*)\)$", re.M)


def comm_test(wait=30.0):
    """raylight's HCCL self-test, as its actors left it in files nothing folds or drops.

    Inside RayInitializer (``skip_comm_test=False``), raylight's ``ray_nccl_tester`` starts one
    ``RayCOMMTester`` actor per rank, named ``RayTest:<rank>``; each joins the process group
    (the shim makes it HCCL), all-reduces ``rank + 1`` on its card and prints
    ``[Rank r] COMM test passed ✅ (result=...)``; raylight waits for every one to be ready, then
    has them exit. This process's own stdout gets those lines only through Ray's log monitor:
    later, and folded into one "[repeated Nx across cluster]" line when they differ only in
    numbers (RAY_DEDUP_LOGS, on by default), so it proves nothing. Read instead, per actor:

    * Ray's actor table (GCS), which keeps dead actors: each ``RayTest:<rank>``'s pid and state
      (``ray.util.state`` would need the dashboard, which raylight starts without);
    * the actor's own stdout, ``<RAYLIGHT_RAY_TMPDIR>/ray/session_latest/logs/worker-<id>-<job>-<pid>.out``
      (raylight's temporary folder holds this session alone: it empties it before ``ray.init``).
      Ray's worker writes it unbuffered (default_worker.py: ``open_log(..., unbuffered=True)``,
      a flush per write), so a line printed in ``__init__`` is there before raylight's
      ``__ray_ready__`` returns; the files are still polled up to ``wait`` seconds. Ray 2.60
      marks the file ``:actor_name:<class>`` (the class, RayCOMMTester, not the actor's name:
      the pid links the two);
    * the bed's HCCL journal (``TESTBED_HCCL_JOURNAL``, testbed/hccl.py): the collectives that
      pid issued, on which physical card.

    ``{"ranks": {rank: [{"actor", "state", "pid", "line", "result", "markers", "hccl"}, ...]},
    "testers": n, "logs": folder}``; no ``RayTest`` actor (``skip_comm_test=True``): no ranks.
    """
    try:
        from ray._private import state

        testers = {info["Pid"]: {"actor": info["Name"], "state": info["State"]} for info in state.actors().values()
                   if str(info.get("Name") or "").startswith("RayTest:")}
        logs = os.path.join(os.environ["RAYLIGHT_RAY_TMPDIR"], "ray", "session_latest", "logs")
        journal = os.environ.get("TESTBED_HCCL_JOURNAL")
        deadline = time.monotonic() + wait
        while True:
            ranks, lined = {}, set()
            for path in sorted(glob.glob(os.path.join(logs, "worker-*.out"))):
                pid = int(os.path.basename(path)[:-len(".out")].rsplit("-", 1)[1])
                with open(path, encoding="utf-8", errors="replace") as log:
                    text = log.read()
                for match in COMM_LINE.finditer(text):
                    lined.add(pid)
                    ranks.setdefault(match.group(1), []).append(dict(
                        testers.get(pid, {"actor": None, "state": None}), pid=pid, line=match.group(0),
                        result=float(match.group(2)), markers=re.findall(r"^:actor_name:(.*)$", text, re.M)))
            if set(testers) <= lined or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        for seen in ranks.values():
            for one in seen:
                path = os.path.join(journal or "", "hccl-%d.jsonl" % one["pid"])
                if journal and os.path.exists(path):
                    with open(path, encoding="utf-8") as lines:
                        one["hccl"] = [[entry["card"], entry["kind"]] for entry in map(json.loads, lines)]
                else:
                    one["hccl"] = None
        return {"ranks": ranks, "testers": len(testers), "logs": logs}
    except Exception as exc:  # noqa: BLE001  (the test names what is missing)
        return {"error": error_line(exc)}


LIVE: dict = {}  # workers one case leaves to the next


def kill(ray_actors):
    RAY["RayKill"]().kill_ray(ray_actors=ray_actors, kill_mode="Kill Entire Cluster")


# --------------------------------------------------------------------------- the cases


def six_heads():
    """A MiniMax-H3 of 6 attention heads (Ulysses 4 cannot split them), its file name."""
    spec = spec_of("minimax", 6)
    name = "tiny_minimax_%s_6heads.safetensors" % OPTS.variant
    if not os.path.exists(os.path.join(MODELS, name)):
        safetensors.torch.save_file(models.checkpoint(spec.build(), spec, OPTS.variant), os.path.join(MODELS, name))
    return name


def case_reference(out):
    runs = [(arch, UNETS[arch]) for arch in ARCHS]
    if "ring2x2" in CASES and "minimax" in ARCHS:
        runs.append(("minimax6", six_heads()))
    if any(re.fullmatch(r"cfg\d+(x\d+)?", name) for name in CASES) and "wan" in ARCHS:
        runs.append(("wancfg", UNETS["wancfg"]))
    if "dp2" in CASES and "wan" in ARCHS:
        runs.append(("wanseed%d" % DP_SEEDS[1], UNETS["wan"]))
    import torch_npu

    for arch, unet in runs:
        (model,) = nodes.UNETLoader().load_unet(unet, "default")
        sampling = SAMPLINGS[arch.rstrip("6")] if not arch.startswith("wanseed") else \
            dict(SAMPLINGS["wan"], noise_seed=int(arch[len("wanseed"):]))
        torch_npu._testbed.reset()  # the bed's kernel counters: what one video takes on one card
        if OPTS.template:
            latent = template_on_one_card(model, sampling)
        else:
            (latent,) = nodes.KSamplerAdvanced().sample(model=model, **sampling)
        out["quant_matmul_" + arch] = torch_npu._testbed.calls["npu_quant_matmul"]
        torch.save(flat(latent["samples"]), os.path.join(OPTS.out_dir, "reference-%s.pt" % arch))
        out["latent_elements_" + arch] = int(flat(latent["samples"]).numel())
        del model
        mm.unload_all_models()


SIGMAS = {}


def template_on_one_card(model, sampling):
    """ComfyUI's custom-sampling template on one card: BasicScheduler's sigmas (kept for the workers),
    RandomNoise, KSamplerSelect, BasicGuider, SamplerCustomAdvanced."""
    from comfy_extras import nodes_custom_sampler as custom

    sigmas = SIGMAS.setdefault(sampling["steps"], custom.BasicScheduler.execute(
        model, sampling["scheduler"], sampling["steps"], 1.0).result[0])
    guider = custom.BasicGuider.execute(model, sampling["positive"]).result[0]
    sampler = custom.KSamplerSelect.execute(sampling["sampler_name"]).result[0]
    noise = custom.RandomNoise.execute(sampling["noise_seed"]).result[0]
    return custom.SamplerCustomAdvanced.execute(noise, guider, sampler, sigmas,
                                                sampling["latent_image"]).result[0]


def template_on_workers(actors, sampling):
    """raylight's template: RayBasicGuider + XFuserSamplerCustomAdvanced with one card's sigmas."""
    from comfy_extras import nodes_custom_sampler as custom

    ray_nodes = nodes.NODE_CLASS_MAPPINGS
    (guider,) = ray_nodes["RayBasicGuider"]().get_guider(actors, sampling["positive"])
    sampler = custom.KSamplerSelect.execute(sampling["sampler_name"]).result[0]
    latent, _, actors = ray_nodes["XFuserSamplerCustomAdvanced"]().ray_sample(
        True, sampling["noise_seed"], guider, sampler, SIGMAS[sampling["steps"]], sampling["latent_image"])
    return latent, actors


def case_ray(out, cards, select=None, ring=1, prefix="ray", fsdp=None):
    degrees = dict(INIT, GPU=cards, ulysses_degree=cards // ring, ring_degree=ring)
    if ring > 1 or fsdp is not None:
        degrees["skip_comm_test"] = True  # the rayN cases prove raylight's HCCL self-test
    if fsdp is not None:
        degrees.update(FSDP=True, FSDP_CPU_OFFLOAD=fsdp != "npu")
    if fsdp == "short":  # ComfyUI's --reserve-vram beyond the card, which raylight hands its workers
        from comfy.cli_args import args as comfy_args

        reserved, comfy_args.reserve_vram = comfy_args.reserve_vram, 4096.0
        try:
            (init,) = RAY["RayInitializer"]().spawn_actor(**degrees)
        finally:
            comfy_args.reserve_vram = reserved
    elif select:
        (init,) = RAY["RayInitializerAdvanced"]().spawn_actor(**dict(degrees, GPU_SELECT=select))
    else:
        (init,) = RAY["RayInitializer"]().spawn_actor(**degrees)
    out["comm_test"] = comm_test()
    out["stage"] = "initialized"
    for arch in PARALLEL_ARCHS:
        actors = sample_on(init, arch, cards, out, prefix)
    if out["name"] == "ring2x2" and "minimax" in PARALLEL_ARCHS:
        actors = sample_on(init, "minimax", cards, out, prefix, unet=six_heads(), saved="minimax6")
    hand_on(out, init, actors)


REUSERS = ("heads", "dead_worker", "vae_decode", "minimax_decode", "dead_ring")  # the cases that go on with the workers of the one before


def hand_on(out, init, actors):
    """The workers to the next case where it goes on with them, else RayKill."""
    following = CASES[CASES.index(out["name"]) + 1:][:1]
    if following and (following[0] in REUSERS or following[0] == out["name"] + "-bf16"):
        LIVE.update(init=init, actors=actors)  # the next case goes on with these workers
        return
    kill(actors)
    out["stage"] = "killed"


def sample_on(init, arch, cards, out, prefix="ray", unet=None, saved=None):
    """One architecture loaded on the workers and sampled (``SAMPLINGS[saved]``): its latent, the
    workers' views."""
    saved = saved or arch
    (actors,) = RAY["RayUNETLoader"]().load_ray_unet(ray_actors_init=init, unet_name=unet or UNETS[arch],
                                                     weight_dtype="default")
    workers = actors["workers"]
    for actor in workers:
        start_counting(actor)
    out["stage"] = "loaded " + arch
    started = time.monotonic()
    sampling = SAMPLINGS[saved] if saved in SAMPLINGS else SAMPLINGS[arch]
    if OPTS.template:
        latent, actors = template_on_workers(actors, sampling)
    else:
        latent, actors = RAY["XFuserKSamplerAdvanced"]().ray_sample(ray_actors=actors, **sampling)
    out["sample_seconds_" + saved] = round(time.monotonic() - started, 2)
    out["stage"] = "sampled " + saved
    name = "%s%d-%s.pt" % (prefix, cards, saved) if prefix == "ray" else "%s-%s.pt" % (prefix, saved)
    torch.save(flat(latent["samples"]), os.path.join(OPTS.out_dir, name))
    out["workers_" + saved] = [worker_view(actor) for actor in workers]
    if saved == "minimax" and prefix == "ray":
        from comfy_extras.nodes_lt import LTXVSeparateAVLatent

        video_latent, _ = LTXVSeparateAVLatent.execute({"samples": latent["samples"]}).result
        vaes.model_minimax_vaes_at_tiny_width()
        path = os.path.join(MODELS, "tiny_minimax_video_vae.safetensors")
        safetensors.torch.save_file(vaes.minimax_video_vae(), path)
        vae = nodes.VAELoader().load_vae(os.path.basename(path))[0]
        (images,) = nodes.VAEDecode().decode(vae, video_latent)
        out["decoded"] = list(images.shape)
        out["decoded_finite"] = bool(torch.isfinite(images).all())
    return actors


def model_bytes(model):
    """Bytes of a ComfyUI model's diffusion-model parameters (one card's copy)."""
    return sum(p.numel() * p.element_size() for p in model.model.diffusion_model.parameters())


def case_fsdp_bf16(out, cards):
    """raylight's FSDP of a bf16 checkpoint: not a quantized one, so worker 0 alone reads it and
    the others get its weights by ``set_model_state_dict(..., broadcast_from_rank0=True)`` over
    HCCL. The same checkpoint sampled by ComfyUI on one card first (``reference-bf16-<arch>.pt``)."""
    unets = {}
    for arch in PARALLEL_ARCHS:
        spec = spec_of(arch, OPTS.heads)
        unets[arch] = "tiny_%s_bf16_%dheads.safetensors" % (arch, OPTS.heads)
        path = os.path.join(MODELS, unets[arch])
        if not os.path.exists(path):
            safetensors.torch.save_file(models.checkpoint(spec.build(), spec, "bf16"), path)
        (model,) = nodes.UNETLoader().load_unet(unets[arch], "default")
        (latent,) = nodes.KSamplerAdvanced().sample(model=model, **SAMPLINGS[arch])
        torch.save(flat(latent["samples"]), os.path.join(OPTS.out_dir, "reference-bf16-%s.pt" % arch))
        out["one_card_weights_" + arch] = model_bytes(model)
        del model
        mm.unload_all_models()
    init = LIVE.pop("init", None)  # right after fsdpN: its workers load the other checkpoint
    LIVE.pop("actors", None)
    if init is None:
        (init,) = RAY["RayInitializer"]().spawn_actor(**dict(INIT, GPU=cards, ulysses_degree=cards, FSDP=True,
                                                               skip_comm_test=True))
    out["stage"] = "initialized"
    for arch in PARALLEL_ARCHS:
        actors = sample_on(init, arch, cards, out, out["name"], unet=unets[arch])
    kill(actors)
    out["stage"] = "killed"


LORA_STRENGTH = 0.8


def tiny_lora(model, rank=2):
    """A seeded LoRA (ComfyUI's generic ``<key>.lora_up/lora_down`` form) for every 2-D weight of the
    diffusion model's attention, its file name."""
    generator = torch.Generator().manual_seed(11)
    tensors = {}
    for key, weight in model.model.diffusion_model.state_dict().items():
        if key.endswith(".weight") and weight.dim() == 2 and "attn" in key:
            out_features, in_features = weight.shape
            stem = "diffusion_model." + key[:-len(".weight")]
            tensors[stem + ".lora_up.weight"] = torch.randn(out_features, rank, generator=generator) * 0.1
            tensors[stem + ".lora_down.weight"] = torch.randn(rank, in_features, generator=generator) * 0.1
    name = "tiny_lora_%s.safetensors" % ARCHS[0]
    safetensors.torch.save_file(tensors, os.path.join(MODELS, name))
    return name, len(tensors) // 2


def case_lora2(out, fsdp=False):
    """raylight's RayLoraLoader on 2 cards (Ulysses 2; ``fsdp``: each card holds half the weights, and
    raylight applies the LoRA to its shards) against ComfyUI's LoraLoaderModelOnly on one card, same
    LoRA and strength; the one-card latent without the LoRA too."""
    arch = ARCHS[0]
    (model,) = nodes.UNETLoader().load_unet(UNETS[arch], "default")
    lora_name, out["lora_layers"] = tiny_lora(model)
    (plain,) = nodes.KSamplerAdvanced().sample(model=model, **SAMPLINGS[arch])
    torch.save(flat(plain["samples"]), os.path.join(OPTS.out_dir, "reference-%s.pt" % arch))
    (with_lora,) = nodes.LoraLoaderModelOnly().load_lora_model_only(model, lora_name, LORA_STRENGTH)
    (latent,) = nodes.KSamplerAdvanced().sample(model=with_lora, **SAMPLINGS[arch])
    torch.save(flat(latent["samples"]), os.path.join(OPTS.out_dir, "reference-lora-%s.pt" % arch))
    if fsdp:  # raylight's FSDP path adds the LoRA beside the int8 weights, as ComfyUI's bypass loader does
        from comfy_extras.nodes_lora_debug import LoraLoaderBypassModelOnly

        (with_lora,) = LoraLoaderBypassModelOnly().load_lora_model_only(model, lora_name, LORA_STRENGTH)
        (latent,) = nodes.KSamplerAdvanced().sample(model=with_lora, **SAMPLINGS[arch])
        torch.save(flat(latent["samples"]), os.path.join(OPTS.out_dir, "reference-lora-bypass-%s.pt" % arch))
    del model, with_lora
    mm.unload_all_models()
    out["stage"] = "one card sampled"
    init = None if fsdp else LIVE.pop("init", None)  # right after ``patched2``: its workers
    if init is None:
        (init,) = RAY["RayInitializer"]().spawn_actor(**dict(INIT, GPU=2, ulysses_degree=2, skip_comm_test=True,
                                                              FSDP=fsdp))
    (lora,) = RAY["RayLoraLoader"]().load_lora(lora_name, LORA_STRENGTH)
    out["ray_lora"] = [[os.path.basename(entry["path"]), entry["strength_model"]] for entry in lora]
    (actors,) = RAY["RayUNETLoader"]().load_ray_unet(ray_actors_init=init, unet_name=UNETS[arch],
                                                     weight_dtype="default", lora=lora)
    workers = actors["workers"]
    for actor in workers:
        start_counting(actor)
    out["stage"] = "loaded " + arch
    latent, actors = RAY["XFuserKSamplerAdvanced"]().ray_sample(ray_actors=actors, **SAMPLINGS[arch])
    torch.save(flat(latent["samples"]), os.path.join(OPTS.out_dir, "%s-%s.pt" % (out["name"], arch)))
    out["stage"] = "sampled " + arch
    out["workers_" + arch] = [worker_view(actor) for actor in workers]
    if not fsdp and CASES[CASES.index(out["name"]) + 1:][:1] == ["gguf2"]:
        LIVE["init"] = init  # gguf2 loads its model on these workers
        return
    kill(actors)
    out["stage"] = "killed"


def card_memory(actor, mark=False):
    """A worker's card memory (bytes now, peak since the last mark) and whether its cached base model is
    the one it held at the last mark; ``mark``: the peak starts again from what is held now, and the
    cached base model is marked."""

    def look(worker):
        import torch as _torch

        cached = getattr(worker, "cached_base_model", None)
        if mark:
            _torch.npu.reset_peak_memory_stats()
            if cached is not None:
                cached.e2e_marked = True
        return {"allocated": _torch.npu.memory_allocated(), "peak": _torch.npu.max_memory_allocated(),
                "cached_base_marked": bool(getattr(cached, "e2e_marked", False))}

    import ray

    return ray.get(actor.__ray_call__.remote(look), timeout=120)


def case_lora_cached(out):
    """raylight's cached base model (non-FSDP, 2 cards, Ulysses 2): MiniMax-H3 sampled without a LoRA, then
    the same model with RayLoraLoader's LoRA on the same workers, against ComfyUI's LoraLoaderModelOnly on
    one card; each worker's card memory while it switches and samples, and whether its base model is the
    one it had cached or one read from the file again."""
    arch = ARCHS[0]
    (model,) = nodes.UNETLoader().load_unet(UNETS[arch], "default")
    lora_name, out["lora_layers"] = tiny_lora(model)
    (with_lora,) = nodes.LoraLoaderModelOnly().load_lora_model_only(model, lora_name, LORA_STRENGTH)
    (latent,) = nodes.KSamplerAdvanced().sample(model=with_lora, **SAMPLINGS[arch])
    torch.save(flat(latent["samples"]), os.path.join(OPTS.out_dir, "reference-lora-cached-%s.pt" % arch))
    del model, with_lora
    mm.unload_all_models()
    out["stage"] = "one card sampled"
    (init,) = RAY["RayInitializer"]().spawn_actor(**dict(INIT, GPU=2, ulysses_degree=2, skip_comm_test=True))
    (actors,) = RAY["RayUNETLoader"]().load_ray_unet(ray_actors_init=init, unet_name=UNETS[arch],
                                                     weight_dtype="default")
    _latent, actors = RAY["XFuserKSamplerAdvanced"]().ray_sample(ray_actors=actors, **SAMPLINGS[arch])
    workers = actors["workers"]
    out["before"] = [card_memory(actor, mark=True) for actor in workers]
    out["stage"] = "sampled without the LoRA"
    (lora,) = RAY["RayLoraLoader"]().load_lora(lora_name, LORA_STRENGTH)
    (actors,) = RAY["RayUNETLoader"]().load_ray_unet(ray_actors_init=init, unet_name=UNETS[arch],
                                                     weight_dtype="default", lora=lora)
    latent, actors = RAY["XFuserKSamplerAdvanced"]().ray_sample(ray_actors=actors, **SAMPLINGS[arch])
    torch.save(flat(latent["samples"]), os.path.join(OPTS.out_dir, "%s-%s.pt" % (out["name"], arch)))
    out["after"] = [card_memory(actor) for actor in actors["workers"]]
    out["stage"] = "sampled with the LoRA"
    kill(actors)
    out["stage"] = "killed"


def case_lora2fsdp(out):
    case_lora2(out, fsdp=True)


def write_gguf(master, spec, path):
    """The tiny Wan 2.1 as a .gguf the way city96's convert.py lays one out (read for what the loader
    expects; written here with the gguf package's own writer): ``general.architecture`` "wan", the
    blocks' attention and FFN linears Q8_0, the modulations and other 1-D tensors F32, the rest F16;
    a tensor of more than 4 dimensions (the 5-D patch embedding, past GGML's 4) stored flat with its
    shape in ``comfy.gguf.orig_shape.<name>``. Returns the weights as the gguf package's numpy
    dequantizer reads them back from the file (fp32), the reference's weights."""
    import gguf
    import numpy

    writer = gguf.GGUFWriter(path, "wan")
    writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_Q8_0)
    kinds = {}
    for key, t in sorted(master.items()):
        data = t.float().numpy()
        if spec.quantized(key, t):
            qtype = gguf.GGMLQuantizationType.Q8_0
            writer.add_tensor(key, gguf.quants.quantize(data, qtype), raw_dtype=qtype)
        else:
            qtype = gguf.GGMLQuantizationType.F32 if t.dim() <= 1 or ".modulation" in key \
                else gguf.GGMLQuantizationType.F16
            data = data.astype(numpy.float32 if qtype == gguf.GGMLQuantizationType.F32 else numpy.float16)
            if data.ndim > 4:
                writer.add_array("comfy.gguf.orig_shape." + key, list(data.shape))
                data = data.reshape(data.shape[0], -1)
            writer.add_tensor(key, data, raw_dtype=qtype)
        kinds[qtype.name] = kinds.get(qtype.name, 0) + 1
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    weights = {}
    for tensor in gguf.GGUFReader(path).tensors:
        values = gguf.quants.dequantize(tensor.data, tensor.tensor_type)
        weights[tensor.name] = torch.from_numpy(numpy.ascontiguousarray(values, dtype=numpy.float32)).reshape(
            master[tensor.name].shape)
    return weights, kinds


def case_gguf2(out):
    """raylight's RayGGUFLoader on 2 cards (Ulysses 2): a tiny Wan 2.1 as a Q8_0 .gguf, loaded on each
    worker by raylight's vendored city96 loader (its torch dequant, on the card), sampled by
    XFuserKSamplerAdvanced; against ComfyUI's own UNETLoader + KSamplerAdvanced on one card of the
    same weights as the gguf package dequantizes them (fp32 safetensors), and the unquantized weights."""
    spec = models.SPECS["wan"](seed=0, heads=OPTS.heads)
    master = spec.build()
    gguf_name = "tiny_wan_q8_0_%dheads.gguf" % OPTS.heads
    weights, out["gguf_types"] = write_gguf(master, spec, os.path.join(MODELS, gguf_name))
    out["q8_0_max_abs_error"] = max((weights[key] - master[key]).abs().max().item() for key in master
                                    if spec.quantized(key, master[key]))
    for label, state in (("dequantized", weights), ("fp32", master)):
        name = "tiny_wan_%s_%dheads.safetensors" % (label, OPTS.heads)
        safetensors.torch.save_file(state, os.path.join(MODELS, name))
        (model,) = nodes.UNETLoader().load_unet(name, "default")
        out["reference_dtype_" + label] = str(model.model.get_dtype())
        (latent,) = nodes.KSamplerAdvanced().sample(model=model, **SAMPLINGS["wan"])
        torch.save(flat(latent["samples"]), os.path.join(OPTS.out_dir, "reference-gguf-%s-wan.pt" % label))
        del model
        mm.unload_all_models()
    out["stage"] = "one card sampled"
    init = LIVE.pop("init", None)  # right after ``lora2``: its workers
    if init is None:
        (init,) = RAY["RayInitializer"]().spawn_actor(**dict(INIT, GPU=2, ulysses_degree=2, skip_comm_test=True))
    out["registered"] = "RayGGUFLoader" in nodes.NODE_CLASS_MAPPINGS
    (actors,) = nodes.NODE_CLASS_MAPPINGS["RayGGUFLoader"]().load_ray_unet(
        ray_actors_init=init, unet_name=gguf_name, dequant_dtype="default", patch_dtype="default")
    workers = actors["workers"]
    for actor in workers:
        start_counting(actor)
    out["stage"] = "loaded"
    started = time.monotonic()
    latent, actors = RAY["XFuserKSamplerAdvanced"]().ray_sample(ray_actors=actors, **SAMPLINGS["wan"])
    out["sample_seconds"] = round(time.monotonic() - started, 2)
    torch.save(flat(latent["samples"]), os.path.join(OPTS.out_dir, "gguf2-wan.pt"))
    out["stage"] = "sampled"
    out["workers_wan"] = [dict(worker_view(actor), model=gguf_model_view(actor)) for actor in workers]
    kill(actors)
    out["stage"] = "killed"


def gguf_model_view(actor):
    """Inside a worker: the class of its model patcher, and per kind of diffusion-model parameter (the
    vendored loader's GGMLTensor, by GGML type) the devices it sits on."""
    import ray

    def look(worker):
        patcher = getattr(worker, "model", None)
        seen = {"patcher": type(patcher).__name__, "params": {}}
        model = patcher.model.diffusion_model
        for param in model.parameters():
            kind = getattr(getattr(param, "tensor_type", None), "name", str(param.dtype))
            seen["params"].setdefault(kind, set()).add(str(param.device.type))
        seen["params"] = {kind: sorted(devices) for kind, devices in seen["params"].items()}
        return seen

    return ray.get(actor.__ray_call__.remote(look), timeout=120)


SHIFT = 5.0  # Wan 2.1's own is 8


def case_patched2(out):
    """raylight's model-patch nodes on 2 cards (Ulysses 2): RayModelSamplingSD3 (shift 5) then
    RayCFGZeroStar, each applied to the model on every worker by raylight's ray_patch, the Wan 2.1 CFG
    workflow (its negative prompt, cfg 5) sampled by XFuserKSamplerAdvanced; against ComfyUI's
    ModelSamplingSD3 and CFGZeroStar with the same values on one card (KSamplerAdvanced), and that
    workflow unpatched on one card. Hands its workers to ``lora2`` when that comes next."""
    from comfy_extras.nodes_cfg import CFGZeroStar
    from comfy_extras.nodes_model_advanced import ModelSamplingSD3

    sampling = SAMPLINGS["wancfg"]
    (model,) = nodes.UNETLoader().load_unet(UNETS["wan"], "default")
    (plain,) = nodes.KSamplerAdvanced().sample(model=model, **sampling)
    torch.save(flat(plain["samples"]), os.path.join(OPTS.out_dir, "reference-wancfg.pt"))
    (shifted,) = ModelSamplingSD3().patch(model, SHIFT)
    patched = CFGZeroStar.execute(shifted).result[0]
    (latent,) = nodes.KSamplerAdvanced().sample(model=patched, **sampling)
    torch.save(flat(latent["samples"]), os.path.join(OPTS.out_dir, "reference-patched-wancfg.pt"))
    del model, shifted, patched
    mm.unload_all_models()
    out["stage"] = "one card sampled"
    (init,) = RAY["RayInitializer"]().spawn_actor(**dict(INIT, GPU=2, ulysses_degree=2, skip_comm_test=True))
    (actors,) = RAY["RayUNETLoader"]().load_ray_unet(ray_actors_init=init, unet_name=UNETS["wan"],
                                                     weight_dtype="default")
    (actors,) = nodes.NODE_CLASS_MAPPINGS["RayModelSamplingSD3"]().patch(ray_actors=actors, shift=SHIFT)
    (actors,) = nodes.NODE_CLASS_MAPPINGS["RayCFGZeroStar"]().patch(ray_actors=actors)
    workers = actors["workers"]
    for actor in workers:
        start_counting(actor)
    out["stage"] = "patched"
    latent, actors = RAY["XFuserKSamplerAdvanced"]().ray_sample(ray_actors=actors, **sampling)
    torch.save(flat(latent["samples"]), os.path.join(OPTS.out_dir, "%s-wancfg.pt" % out["name"]))
    out["stage"] = "sampled"
    out["workers_wancfg"] = [worker_view(actor) for actor in workers]
    if CASES[CASES.index(out["name"]) + 1:][:1] == ["lora2"]:
        LIVE["init"] = init  # lora2 loads its model on these workers
        return
    kill(actors)
    out["stage"] = "killed"


def case_heads(out):
    init, actors = LIVE.pop("init"), LIVE.pop("actors")
    name = six_heads()
    try:
        (actors,) = RAY["RayUNETLoader"]().load_ray_unet(ray_actors_init=init, unet_name=name, weight_dtype="default")
        RAY["XFuserKSamplerAdvanced"]().ray_sample(ray_actors=actors, **SAMPLING)
    finally:
        kill(actors)


def case_cfg(out, cfg, ulysses):
    """raylight's CFG parallel: positive and negative of one Wan 2.1 workflow on cfg_degree groups of
    cards, each half split over its group's ``ulysses`` cards by Ulysses."""
    (init,) = RAY["RayInitializer"]().spawn_actor(**dict(INIT, GPU=cfg * ulysses, ulysses_degree=ulysses,
                                                         ring_degree=1, cfg_degree=cfg, skip_comm_test=True))
    out["stage"] = "initialized"
    actors = sample_on(init, "wan", cfg * ulysses, out, prefix=out["name"], saved="wancfg")
    hand_on(out, init, actors)


DP_SEEDS = (42, 43)  # the first is every other case's seed: reference-wan.pt is its one-card video


def case_dp2(out):
    """raylight's data parallel: DPKSamplerAdvanced, one whole Wan 2.1 video per card, each its own seed
    (DPNoiseList), on 2 workers of no Ulysses, ring or CFG degree."""
    (init,) = RAY["RayInitializer"]().spawn_actor(**dict(INIT, GPU=2, ulysses_degree=0, ring_degree=0, cfg_degree=0,
                                                         dp_degree=2, skip_comm_test=True))
    out["stage"] = "initialized"
    (actors,) = RAY["RayUNETLoader"]().load_ray_unet(ray_actors_init=init, unet_name=UNETS["wan"],
                                                     weight_dtype="default")
    workers = actors["workers"]
    for actor in workers:
        start_counting(actor)
    (seeds,) = RAY["DPNoiseList"]().get_noise(**{"noise_seed_%d" % i: DP_SEEDS[i] if i < len(DP_SEEDS) else 0
                                                 for i in range(8)})
    sampling = SAMPLINGS["wan"]
    started = time.monotonic()
    latents, actors = RAY["DPKSamplerAdvanced"]().ray_sample(  # every input a list (INPUT_IS_LIST)
        ray_actors=[actors], noise_list=seeds, latent_image=[sampling["latent_image"]], denoise=[1.0],
        **{key: [sampling[key]] for key in ("add_noise", "steps", "cfg", "sampler_name", "scheduler", "positive",
                                            "negative", "start_at_step", "end_at_step",
                                            "return_with_leftover_noise")})
    out["sample_seconds"] = round(time.monotonic() - started, 2)
    for seed, latent in zip(DP_SEEDS, latents):
        torch.save(flat(latent["samples"]), os.path.join(OPTS.out_dir, "dp2-wanseed%d.pt" % seed))
    out["videos"] = len(latents)
    out["workers_wan"] = [worker_view(actor) for actor in workers]
    hand_on(out, init, actors)


def record_tiles():
    """In the process it runs in: wrap the Wan 2.1 VAE's decode to keep what each call decoded
    (the latent tile's shape, a digest of its values, one of the pixels decoded, and whether autograd
    recorded the decode). ``tiles_decoded`` reads them."""
    import hashlib

    import comfy.ldm.wan.vae as wan_vae

    cls = wan_vae.WanVAE
    if not hasattr(cls, "recorded_tiles"):
        original = cls.decode

        def decode(self, z, *args, **kwargs):
            values = z.detach().float().cpu().contiguous()
            decoded = original(self, z, *args, **kwargs)
            pixels = decoded.detach().float().cpu().contiguous()
            # the last: whether autograd recorded the decode (its activations held while the tile lives)
            cls.recorded_tiles.append([list(z.shape), hashlib.sha1(values.numpy().tobytes()).hexdigest()[:16],
                                       hashlib.sha1(pixels.numpy().tobytes()).hexdigest()[:16],
                                       bool(decoded.requires_grad)])
            return decoded

        cls.decode = decode
    cls.recorded_tiles = []
    return True


def tiles_decoded():
    import comfy.ldm.wan.vae as wan_vae

    return list(getattr(wan_vae.WanVAE, "recorded_tiles", []))


# as a user sets both nodes: 64-pixel tiles (8 latent pixels) overlapping by min(32, 64 // 4) = 16 pixels
# (2 latent), the video whole in time (64 frames: 16 latent); a temporal overlap of 4 and the default 8
VAE_TILES = {"t4": dict(tile_size=64, overlap=32, temporal_size=64, temporal_overlap=4),
             "t8": dict(tile_size=64, overlap=32, temporal_size=64, temporal_overlap=8)}


def tiles_over(size, tile, overlap, scale):
    """How many tiles cover each output pixel along one axis: tiles of ``tile`` latent pixels start
    every ``tile - overlap`` (ComfyUI's tiled_scale_multidim, the spatial axes of a video VAE)."""
    cover = torch.zeros(size * scale, dtype=torch.int64)
    for start in (range(0, size - overlap, tile - overlap) if size > tile else [0]):
        cover[start * scale:min(start + tile, size) * scale] += 1
    return cover


def compare_frames(images, reference, into):
    """Shapes, bit-equality, max |diff| and cosine of two decodes into ``into``; both as float CPU tensors."""
    into["shapes"] = [list(images.shape), list(reference.shape)]
    images, reference = images.float().cpu(), reference.float().cpu()
    into["equal"] = bool(images.shape == reference.shape and torch.equal(images, reference))
    if images.shape == reference.shape:
        into["max_abs"] = (images - reference).abs().max().item()
        into["cosine"] = torch.nn.functional.cosine_similarity(images.flatten().double(),
                                                                reference.flatten().double(), dim=0).item()
    return images, reference


def case_vae_decode(out):
    """raylight's RayVAEDecodeDistributed on the workers of the case before, against ComfyUI's
    VAEDecodeTiled on one card with the same tile settings (each of ``VAE_TILES``)."""
    import ray

    init, actors = LIVE.pop("init"), LIVE.pop("actors")
    try:
        name = "tiny_wan21_vae.safetensors"
        safetensors.torch.save_file(vaes.wan21_vae(), os.path.join(MODELS, name))
        # 9 frames of 128 x 128: a grid of 3 x 3 tiles
        latent = torch.randn(1, 16, 3, 16, 16, generator=torch.Generator().manual_seed(5))
        cover = [tiles_over(side, 8, 2, 8) for side in latent.shape[-2:]]
        cover = cover[0][:, None] * cover[1][None, :]
        vae = nodes.VAELoader().load_vae(name)[0]
        workers = actors["workers"]
        out["decodes"] = {}
        for label, tiles in VAE_TILES.items():
            seen = out["decodes"][label] = {}
            for actor in workers:
                start_counting(actor)
                ray.get(actor.__ray_call__.remote(lambda worker: record_tiles()), timeout=120)
            started = time.monotonic()
            with torch.inference_mode():  # as ComfyUI's executor runs every node
                (images,) = RAY["RayVAEDecodeDistributed"]().ray_decode(ray_actors=actors, vae_name=name,
                                                                         samples={"samples": latent}, **tiles)
            seen["ray_decode_seconds"] = round(time.monotonic() - started, 2)
            seen["workers"] = [dict(worker_view(actor), tiles=ray.get(
                actor.__ray_call__.remote(lambda worker: tiles_decoded()), timeout=120)) for actor in workers]
            record_tiles()
            started = time.monotonic()
            with torch.inference_mode():
                (reference,) = nodes.VAEDecodeTiled().decode(vae, {"samples": latent}, **tiles)
            seen["tiled_decode_seconds"] = round(time.monotonic() - started, 2)
            seen["reference_tiles"] = tiles_decoded()
            images, reference = compare_frames(images, reference, seen)
            if images.shape == reference.shape:
                seen["max_ref"] = reference.abs().max().item()
                differs = images != reference  # frames, y, x, channels
                seen["differing_per_frame"] = differs.any(-1).sum((1, 2)).tolist()
                seen["tiles_over_differing"] = sorted({int(n) for n in cover[differs.any(-1).any(0)]})
                # per frame, the differing pixels that one or two tiles cover (no four-tile corner)
                seen["differing_per_frame_two_or_fewer"] = (differs.any(-1) & (cover <= 2)).sum((1, 2)).tolist()
        del vae
        mm.unload_all_models()
    except BaseException:
        kill(actors)
        raise
    hand_on(out, init, actors)


def record_minimax_tiles(die=False):
    """In the process it runs in: the MiniMax-H3 video VAE's tile calls (``_decode_pixels``) each keep
    the latent slice's shape and a digest of its values; ``minimax_tiles`` reads them. Also counts
    the ops on this process's cards from here on. ``die``: the process ends in its first tile."""
    import hashlib

    import comfy.ldm.minimax.vae as minimax_vae

    from testbed import npu_device as nd

    vaes.model_minimax_vaes_at_tiny_width()
    cls = minimax_vae.MiniMaxH3VideoVAE.__mro__[1] if getattr(minimax_vae.MiniMaxH3VideoVAE, "tiny", False) \
        else minimax_vae.MiniMaxH3VideoVAE
    if not hasattr(cls, "recorded_tiles"):
        original = cls._decode_pixels

        def _decode_pixels(self, z):
            if getattr(cls, "die_in_tile", False):  # this worker's process ends in its first tile
                os._exit(1)
            values = z.detach().float().cpu().contiguous()
            cls.recorded_tiles.append([list(z.shape), hashlib.sha1(values.numpy().tobytes()).hexdigest()[:16]])
            return original(self, z)

        cls._decode_pixels = _decode_pixels
    cls.recorded_tiles = []
    cls.die_in_tile = die
    nd.reset_op_counts(enable=True)
    nd.reset_cpu_fallbacks()
    return True


def minimax_tiles():
    import comfy.ldm.minimax.vae as minimax_vae

    from testbed import npu_device as nd

    cls = minimax_vae.MiniMaxH3VideoVAE.__mro__[1] if getattr(minimax_vae.MiniMaxH3VideoVAE, "tiny", False) \
        else minimax_vae.MiniMaxH3VideoVAE
    return {"tiles": list(getattr(cls, "recorded_tiles", [])),
            "ops": sum(n for (index, _), n in nd.op_counts_by_device().items() if index is not None),
            "cpu_fallbacks": dict(nd.cpu_fallbacks())}


MINIMAX_LATENT = (1, 24, 12, 24, 24)  # 39 frames of 384 x 384: 2 temporal chunks of 2 x 2 spatial tiles


def minimax_ray_decode(actors, name, latent):
    with torch.inference_mode():  # as ComfyUI's executor runs every node
        (images,) = RAY["RayVAEDecodeDistributed"]().ray_decode(ray_actors=actors, vae_name=name,
                                                                 samples={"samples": latent}, tile_size=512,
                                                                 overlap=64, temporal_size=64, temporal_overlap=8)
    return images


def case_minimax_decode(out):
    """raylight's RayVAEDecodeDistributed of MiniMax-H3's video VAE (which tiles itself) on the workers of
    the case before, against ComfyUI's own VAEDecode on one card: a latent of 12 x 24 x 24 (39 frames of
    384 x 384), which that VAE decodes as 2 temporal chunks of 2 x 2 spatial tiles."""
    import ray

    init, actors = LIVE.pop("init"), LIVE.pop("actors")
    try:
        vaes.model_minimax_vaes_at_tiny_width()
        name = "tiny_minimax_video_vae.safetensors"
        safetensors.torch.save_file(vaes.minimax_video_vae(), os.path.join(MODELS, name))
        latent = torch.randn(*MINIMAX_LATENT, generator=torch.Generator().manual_seed(9))
        workers = actors["workers"]
        for actor in workers:
            start_counting(actor)
            ray.get(actor.__ray_call__.remote(lambda worker: record_minimax_tiles()), timeout=120)
        started = time.monotonic()
        images = minimax_ray_decode(actors, name, latent)
        out["ray_decode_seconds"] = round(time.monotonic() - started, 2)
        out["workers"] = [dict(worker_view(actor), **ray.get(actor.__ray_call__.remote(
            lambda worker: minimax_tiles()), timeout=120)) for actor in workers]
        vae = nodes.VAELoader().load_vae(name)[0]
        record_minimax_tiles()
        started = time.monotonic()
        with torch.inference_mode():
            (reference,) = nodes.VAEDecode().decode(vae, {"samples": latent})
        out["decode_seconds"] = round(time.monotonic() - started, 2)
        out["reference"] = minimax_tiles()
        compare_frames(images, reference, out)
        del vae
        mm.unload_all_models()
    except BaseException:
        kill(actors)
        raise
    hand_on(out, init, actors)


def case_ring_misfit(out):
    RAY["RayInitializer"]().spawn_actor(**dict(INIT, GPU=2, ulysses_degree=2, ring_degree=2, skip_comm_test=True))


def case_too_many(out):
    RAY["RayInitializer"]().spawn_actor(**dict(INIT, GPU=OPTS.cards * 2, skip_comm_test=True))


def case_gpu_cluster(out):
    given = os.environ.get("RAY_OVERRIDE_RESOURCES")
    os.environ["RAY_OVERRIDE_RESOURCES"] = json.dumps({"CPU": 8, "GPU": OPTS.cards, "NPU": 0})
    try:
        RAY["RayInitializer"]().spawn_actor(**dict(INIT, skip_comm_test=True))
    finally:
        if given is None:
            os.environ.pop("RAY_OVERRIDE_RESOURCES", None)
        else:
            os.environ["RAY_OVERRIDE_RESOURCES"] = given
        import ray

        ray.shutdown()


def die_in_ring_attention():
    """In the process it runs in: the process ends in its first ring step's attention
    (``torch_npu.npu_fusion_attention``, which the shim's ring step calls)."""
    import torch_npu

    def ending(*args, **kwargs):
        os._exit(1)

    torch_npu.npu_fusion_attention = ending
    return True


def still_running(pids, wait):
    """The processes of ``pids`` still alive after up to ``wait`` seconds."""
    deadline = time.monotonic() + wait
    while True:
        alive = []
        for pid in pids:
            try:
                os.kill(pid, 0)
                alive.append(pid)
            except ProcessLookupError:
                pass
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.2)


def case_dead_ring(out):
    """Right after a ring case (its workers, the last architecture loaded): the last worker's process
    ends inside its first ring step's attention while the others wait on its keys and values; the
    sampler's error, then RayKill, and no worker left waiting."""
    import ray

    LIVE.pop("init", None)
    actors = LIVE.pop("actors")
    workers = actors["workers"]
    others = [worker_view(actor)["pid"] for actor in workers[:-1]]
    ray.get(workers[-1].__ray_call__.remote(lambda worker: die_in_ring_attention()), timeout=120)
    started = time.monotonic()
    try:
        RAY["XFuserKSamplerAdvanced"]().ray_sample(ray_actors=actors, **SAMPLINGS[ARCHS[-1]])
    finally:
        out["stopped_after"] = round(time.monotonic() - started, 2)
        kill(actors)
        out["left_running"] = still_running(others, wait=30.0)


def case_dead_worker(out):
    import ray

    actors = LIVE.pop("actors")
    last = actors["workers"][-1]
    try:
        if "minimax_decode" in CASES:  # the last worker's process ends in the middle of a distributed decode
            ray.get(last.__ray_call__.remote(lambda worker: record_minimax_tiles(die=True)), timeout=120)
            started = time.monotonic()
            try:
                minimax_ray_decode(actors, "tiny_minimax_video_vae.safetensors", torch.randn(*MINIMAX_LATENT))
                out["decode_error"] = None
            except Exception as exc:  # noqa: BLE001  (what ComfyUI's console shows for the node)
                out["decode_error"] = error_text(exc)[:2000]
            out["decode_seconds"] = round(time.monotonic() - started, 2)
        else:
            ray.kill(last)
        RAY["XFuserKSamplerAdvanced"]().ray_sample(ray_actors=actors, **SAMPLING)
    finally:
        kill(actors)
        out["killed_after_error"] = not ray.is_initialized()


for name in CASES:
    entry = report["cases"][name] = {"name": name}
    started = time.monotonic()
    try:
        if name.startswith("ray") and name[3:].partition("@")[0].isdigit():
            count, _, select = name[3:].partition("@")
            case_ray(entry, int(count), select.replace("+", ","))
        elif re.fullmatch(r"fsdp\d+-bf16", name):
            case_fsdp_bf16(entry, int(name[4:].partition("-")[0]))
        elif re.fullmatch(r"fsdp\d+(cpu)?(-short)?", name):
            count, offload, short = re.fullmatch(r"fsdp(\d+)(cpu)?(-short)?", name).groups()
            case_ray(entry, int(count), prefix=name, fsdp="short" if short else "cpu" if offload else "npu")
        elif re.fullmatch(r"cfg\d+(x\d+)?", name):
            cfg, _, ulysses = name[3:].partition("x")
            case_cfg(entry, int(cfg), int(ulysses or 1))
        elif re.fullmatch(r"ring\d+(x\d+)?", name):
            ring, _, ulysses = name[4:].partition("x")
            case_ray(entry, int(ring) * int(ulysses or 1), ring=int(ring), prefix=name)
        else:
            globals()["case_" + name](entry)
        entry["result"] = "ok"
    except BaseException as exc:  # what ComfyUI's console would show for this node
        entry["result"] = error_line(exc)
        entry["error"] = error_text(exc)[-4000:]
    entry["seconds"] = round(time.monotonic() - started, 2)
    entry["comfyui_alive"] = True  # this process went on to the next case

try:
    import ray

    if ray.is_initialized():
        ray.shutdown()
except Exception:
    pass
emit()
