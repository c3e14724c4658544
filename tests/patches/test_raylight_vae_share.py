"""MiniMax-H3's video VAE shared over the cards by raylight's distributed decode (patch
``raylight_vae_share``), two ranks on the bed: the bad inputs.

Each rank is a fresh interpreter of a venv the wheel was installed into, on its own simulated card
of the users' box (ComfyUI v0.30.0 started as its main.py does, raylight 1.7.2's worker module),
in an ``hccl`` world as raylight's workers join it. It calls raylight's own
``ray_vae_decode_partial_impl`` as a worker does, on a worker holding ComfyUI's MiniMax-H3 video
VAE (v0.30.0's code, tiny width). ``tests/e2e/test_raylight.py`` runs the whole node through Ray;
here: the frames of one card, a rank whose tile fails (every rank stops, none waits on another),
a decode whose tiles cannot be planned and no process group (worker 0 decodes it whole and says
so), and the patch turned off (raylight's own refusal).
"""

import pytest

import harness


pytestmark = [
    pytest.mark.skipif(not harness.torch_available(), reason="torch is not installed"),
    pytest.mark.skipif(not harness.raylight_available(), reason="ray/xfuser/yunchang are not installed "
                       "(tests/requirements-raylight.txt)"),
]

RANK = r'''
import contextlib, io, json, os, sys, types
from datetime import timedelta
from comfyui_start import start_comfyui

start_comfyui(os.environ["COMFY"])
import torch
import torch.distributed as dist
import comfy.sd
import tiny_vaes as vaes
from testbed import hccl

rank = int(os.environ["RANK"])
torch.npu.set_device(0)
vaes.model_minimax_vaes_at_tiny_width()
vae = comfy.sd.VAE(sd=vaes.minimax_video_vae())
worker = types.SimpleNamespace(vae_model=vae)
latent = torch.randn(1, 24, 12, 24, 24, generator=torch.Generator().manual_seed(9))  # 2 chunks x 2 x 2 tiles
from raylight.distributed_worker import ray_worker


def line(exc):
    return "%s: %s" % (type(exc).__name__, str(exc).strip().splitlines()[0])


def partial(world):
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        parts = ray_worker.ray_vae_decode_partial_impl(worker, {"samples": latent}, 512, 64, 64, 8, rank, world)
    (part,) = parts
    return part, err.getvalue()


def one_card():
    with torch.inference_mode():
        out = vae.first_stage_model.decode(latent.to(vae.device, vae.vae_dtype))
    return out.to("cpu", dtype=vae.vae_output_dtype())


out = {"patch": {r["name"]: r["state"] for r in __import__("ascend_shim").status()["patches"]}["raylight_vae_share"]}
if os.environ.get("ASCEND_SHIM_DISABLE"):  # raylight's own path
    try:
        partial(2)
    except Exception as exc:
        out["error"] = line(exc)
    print(json.dumps(out))
    sys.exit(0)

dist.init_process_group("hccl", init_method="file://" + os.environ["STORE"], rank=rank, world_size=2,
                        timeout=timedelta(seconds=60))
shared = out["shared"] = {}
try:  # the frames of one card
    hccl.reset_collective_bytes()
    part, _ = partial(2)
    shared["tiles"], shared["shape"] = len(part["tiles"]), list(part["output_shape"])
    if part["tiles"]:
        shared["equal"] = torch.equal(part["tiles"][0][-1], one_card())
    shared["hccl"] = {kind: v["calls"] for (card, kind), v in hccl.collective_bytes().items()}
except Exception as exc:
    shared["error"] = line(exc)

model = vae.first_stage_model
if rank == 1:  # this rank's second tile runs out of card memory
    compute, calls = model._decode_pixels, []

    def failing(z):
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError("NPU out of memory. Tried to allocate 2.00 GiB")
        return compute(z)

    model._decode_pixels = failing
try:
    partial(2)
    out["failed_tile"] = None
except Exception as exc:
    out["failed_tile"] = line(exc)
vars(model).pop("_decode_pixels", None)

planless = out["unplanned"] = {}  # a ComfyUI whose blend reads a tile's value, which an empty tile has not
blend = model.blend


def blend_reading_a_value(a, b, blend_extent, dim):
    float(a.flatten()[0])
    return blend(a, b, blend_extent, dim)


model.blend = blend_reading_a_value
try:
    hccl.reset_collective_bytes()
    part, planless["stderr"] = partial(2)
    planless["tiles"], planless["shape"] = len(part["tiles"]), list(part["output_shape"])
    if part["tiles"]:
        planless["equal"] = torch.equal(part["tiles"][0][-1], one_card())
    planless["hccl"] = {kind: v["calls"] for (card, kind), v in hccl.collective_bytes().items()}
except Exception as exc:
    planless["error"] = line(exc)
vars(model).pop("blend", None)
dist.destroy_process_group()

alone = out["no_group"] = {}  # the workers share no process group
decodes, decode = [], model.decode


def counted(z):  # ComfyUI's decode, run whole or on empty tiles to plan the shape
    decodes.append(z.device.type)
    return decode(z)


model.decode = counted
try:
    part, alone["stderr"] = partial(2)
    alone["decodes"] = len(decodes)
    alone["tiles"], alone["shape"] = len(part["tiles"]), list(part["output_shape"])
    if part["tiles"]:
        alone["equal"] = torch.equal(part["tiles"][0][-1], one_card())
except Exception as exc:
    alone["error"] = line(exc)
print(json.dumps(out))
'''


def _ranks(bed_python, tmp_path, **env):
    return harness.raylight_ranks(bed_python, tmp_path, RANK, extra_path=(harness.TESTS / "e2e",),
                                  COMFY=str(harness.comfyui_dir(harness.COMFYUI_USER)), **env)


def test_shared_tiles_give_one_cards_frames_a_failed_tile_stops_every_rank_else_worker_zero_decodes_whole(
        bed_python, tmp_path):
    first, second = _ranks(bed_python, tmp_path)
    assert first["patch"] == second["patch"] == "applied"
    one, two = first["shared"], second["shared"]
    assert "error" not in one and "error" not in two, (one, two)
    # worker 0 returns the whole video as one tile, the same bits as one card's own decode; the
    # other worker nothing, with the same shape for raylight's combine: 39 frames of 384 x 384
    assert (one["tiles"], one["equal"], two["tiles"]) == (1, True, 0), (one, two)
    assert one["shape"] == two["shape"] == [1, 3, 39, 384, 384]
    # one all-reduce (the ranks agree), then the 4 tiles (of 8) worker 1 computed go to worker 0
    assert one["hccl"] == {"all_reduce": 1, "recv": 4} and two["hccl"] == {"all_reduce": 1, "send": 4}
    # a failed tile: its rank names it, the other hears of it; neither waits for the other
    assert second["failed_tile"] == "ShareRefused: this card: RuntimeError: NPU out of memory. " \
                                    "Tried to allocate 2.00 GiB", second
    assert first["failed_tile"] == "ShareRefused: another card's share of the tiles failed (its worker " \
                                   "says why)", first
    # a decode whose tiles cannot be planned: worker 0 decodes it whole and says why, once; the other
    # learns the shape in a second all-reduce
    one, two = first["unplanned"], second["unplanned"]
    assert "error" not in one and "error" not in two, (one, two)
    assert (one["tiles"], one["equal"], two["tiles"]) == (1, True, 0), (one, two)
    assert one["shape"] == two["shape"] == [1, 3, 39, 384, 384]
    assert one["hccl"] == two["hccl"] == {"all_reduce": 2}, (one, two)
    assert one["stderr"] == ("ascend_shim: warning: raylight's distributed VAE decode: the decode's tiles could not "
                             "be planned (RuntimeError: Tensor.item() cannot be called on meta tensors), so worker "
                             "0's card decodes the MiniMax-H3 video whole (ComfyUI's own decode)\n"), one
    assert two["stderr"] == ""
    # no process group: worker 0's card decodes the video whole, and says so once
    one, two = first["no_group"], second["no_group"]
    assert "error" not in one and "error" not in two, (one, two)
    assert (one["tiles"], one["equal"], two["tiles"]) == (1, True, 0), (one, two)
    assert one["shape"] == two["shape"] == [1, 3, 39, 384, 384]
    # worker 0 runs ComfyUI's decode once, whole; the other once, on empty tiles, for the shape alone
    assert (one["decodes"], two["decodes"]) == (1, 1), (one, two)
    assert one["stderr"] == ("ascend_shim: warning: raylight's distributed VAE decode: the workers share no "
                             "process group, so worker 0's card decodes the MiniMax-H3 video whole (ComfyUI's own "
                             "decode)\n"), one
    assert two["stderr"] == ""


def test_without_the_patch_raylight_refuses_the_vae(bed_python, tmp_path):
    for out in _ranks(bed_python, tmp_path, ASCEND_SHIM_DISABLE="raylight_vae_share"):
        assert out["patch"] == "disabled"
        assert out["error"] == "ValueError: Distributed VAE (Ray) cannot externally tile this VAE. Use SeedVR2 " \
                               "VAE Decode Distributed (Ray) for SeedVR2.", out
