"""raylight's padding never enters the attention of MiniMax-H3 and Wan on the NPUs (patches
``raylight_padding``, ``raylight_minimax_keys``, ``raylight_wan_keys`` and ``yunchang_ring``), every
sequence-parallel split the bed can run.

raylight cuts a DiT's token sequence into one equal part per card and pads a sequence the card
count does not divide with zero rows (``pad_to_world_size``); its attention takes no mask, so the
zero rows are keys in every softmax. Each rank here is a fresh interpreter of a venv the wheel was
installed into, on its own simulated card, in an ``hccl`` world of ring x Ulysses ranks set up by
raylight's own ``initialize_xfuser_parallel``. For each model it builds ComfyUI v0.30.0's own
attention module of a tiny seeded model (MiniMax-H3's ``Attention``, Wan 2.1's first
``WanSelfAttention`` with its rope), pads a seeded bf16 sequence with raylight's
``pad_to_world_size``, runs raylight's own sequence-parallel self-attention (``usp_attn_forward``,
``usp_self_attn_forward``) on this rank's part, and compares its real rows with ComfyUI's own
attention of the unpadded sequence on one card. Sequence lengths: divisible by the card count and
not, one so short that a whole ring block is padding.

Bound: the bed computes one card's attention and each ring step in float32 with one rounding to
bf16, and the ring merges the steps in float32 before one more; so the parts differ from one card by
a few bf16 steps of the output's magnitude. Without the patches the padded keys move the output by
far more (measured in the note of each split).
"""

import pytest

import harness

pytestmark = [
    pytest.mark.skipif(not harness.torch_available(), reason="torch is not installed"),
    pytest.mark.skipif(not harness.raylight_available(), reason="ray/xfuser/yunchang are not installed "
                       "(tests/requirements-raylight.txt)"),
]

RANK = r'''
import json, os, sys
from datetime import timedelta
from comfyui_start import start_comfyui

start_comfyui(os.environ["COMFY"])
import torch
import torch.distributed as dist
import torch_npu
from testbed import npu_device

rank, world = int(os.environ["RANK"]), int(os.environ["WORLD"])
ring, ulysses = int(os.environ["RING"]), int(os.environ["ULYSSES"])
torch.npu.set_device(0)
dist.init_process_group("hccl", init_method="file://" + os.environ["STORE"], rank=rank, world_size=world,
                        timeout=timedelta(seconds=60))
from raylight.distributed_worker.parallel_group_manager import initialize_xfuser_parallel

initialize_xfuser_parallel(local_rank=rank, world_size=world, parallel_dict={
    "is_xdit": True, "attention": "TORCH_FLASH", "sync_ulysses": False, "ulysses_degree": ulysses,
    "ring_degree": ring})
import comfy.ldm.minimax.model
import comfy.ldm.wan.model
import comfy.ops
from raylight.diffusion_models.utils import pad_to_world_size
from raylight.diffusion_models.minimax import xdit_context_parallel as minimax_usp
from raylight.diffusion_models.wan import xdit_context_parallel as wan_usp
import tiny_models

DTYPE = torch.bfloat16
HEADS = int(os.environ["HEADS"])


def module_of(model_class, spec, pick):
    """ComfyUI's own model of ``spec`` (its seeded weights, bf16, on this card) and one module of it."""
    model = model_class(dtype=DTYPE, device="cpu", operations=comfy.ops.disable_weight_init, **spec.config)
    model.load_state_dict(spec.build())
    model = model.to("npu", DTYPE)
    return model, pick(model)


def part(t, dim):
    size = t.shape[dim] // world
    return t.narrow(dim, rank * size, size)


def compare(name, rows, one_card, run, dim):
    """one_card(x) on the whole real sequence against run(x_part) over this rank's part of the padded one."""
    generator = torch.Generator().manual_seed(rows)
    x = (torch.randn([rows, HIDDEN[name]] if dim == 0 else [1, rows, HIDDEN[name]], generator=generator)
         .to(DTYPE).to("npu"))
    want = one_card(x)
    padded, real = pad_to_world_size(x, dim=dim)
    fused = torch_npu._testbed.calls.get("npu_fusion_attention", 0) + torch_npu._testbed.sdpa_paths["fused"]
    got = run(part(padded, dim), padded.shape[dim])
    # the fused attention kernels of raylight's part: ring steps (npu_fusion_attention) or torch's SDPA
    calls = torch_npu._testbed.calls.get("npu_fusion_attention", 0) + torch_npu._testbed.sdpa_paths["fused"] - fused
    gathered = [torch.empty_like(got) for _ in range(world)]
    dist.all_gather(gathered, got.contiguous())
    got = torch.cat(gathered, dim=dim).narrow(dim, 0, real)
    return {"rows": rows, "padded": int(padded.shape[dim]), "fusion_attention": calls,
            "max_abs": (got.float() - want.float()).abs().max().item(), "max_ref": want.float().abs().max().item(),
            "finite": bool(torch.isfinite(got).all())}


out = {"cases": [], "patches": {r["name"]: r["state"] for r in __import__("ascend_shim").status()["patches"]
                                if r["name"] in ("raylight_padding", "raylight_minimax_keys", "raylight_wan_keys",
                                                 "yunchang_ring")}}
npu_device.reset_cpu_fallbacks()

minimax_spec = tiny_models.SPECS["minimax"](seed=0, heads=HEADS)
_, attention = module_of(comfy.ldm.minimax.model.MiniMaxH3Model, minimax_spec, lambda model: model.blocks[0].attn)
wan_spec = tiny_models.SPECS["wan"](seed=0, heads=HEADS)
wan, self_attention = module_of(comfy.ldm.wan.model.WanModel, wan_spec, lambda model: model.blocks[0].self_attn)
HIDDEN = {"minimax": minimax_spec.config["hidden_size"], "wan": wan_spec.config["dim"]}


def wan_freqs(rows):  # Wan's rope of a 1 x 1 x rows patch grid (latent 1 x 2 x 2 rows)
    return wan.rope_encode(1, 2, 2 * rows, device=torch.device("npu"), dtype=DTYPE)


with torch.inference_mode():
    for rows in [int(n) for n in os.environ["ROWS"].split(",")]:
        case = compare("minimax", rows, lambda x: attention(x),
                       lambda x, padded: minimax_usp.usp_attn_forward(attention, x), 0)
        out["cases"].append(dict(case, model="minimax"))

        def wan_one_card(x, rows=rows):
            return self_attention(x, wan_freqs(rows))

        def wan_parts(x, padded, rows=rows):
            freqs, _ = pad_to_world_size(wan_freqs(rows), dim=1)
            return wan_usp.usp_self_attn_forward(self_attention, x, part(freqs, 1))

        out["cases"].append(dict(compare("wan", rows, wan_one_card, wan_parts, 1), model="wan"))
out["cpu_fallbacks"] = dict(npu_device.cpu_fallbacks())
dist.destroy_process_group()
print(json.dumps(out))
'''

# (ring, Ulysses): every split of 2 to 8 cards the bed runs (Ulysses needs 6 heads for 3 and 6, 4 for 4)
SPLITS = [(1, 2), (2, 1), (2, 2), (1, 4), (4, 1), (2, 3), (3, 2), (2, 4)]
# real rows: 186 (MiniMax-H3's 96 x 160, 22-frame video with 7 text tokens), 192 (every card count divides
# it), 97 (none does), 5 (on 8 cards: whole blocks of padding)
ROWS = "186,192,97,5"
BF16_STEPS = 4 * 2.0 ** -8  # a few bf16 steps (2^-8 of the magnitude each) for the roundings named above


def heads_for(ulysses):
    return 6 if ulysses in (3, 6) else 4


def ranks(bed_python, folder, ring, ulysses, **env):
    cards = ring * ulysses
    return harness.raylight_ranks(bed_python, folder, RANK, extra_path=(harness.TESTS / "e2e",),
                                  cards=tuple(range(cards)), box=max(4, cards), timeout=400,
                                  COMFY=str(harness.comfyui_dir(harness.COMFYUI_USER)), RING=str(ring),
                                  ULYSSES=str(ulysses), HEADS=str(heads_for(ulysses)), ROWS=ROWS, **env)


@pytest.mark.parametrize("ring, ulysses", SPLITS)
def test_every_split_attends_to_the_real_rows_only(bed_python, tmp_path, ring, ulysses):
    outs = ranks(bed_python, tmp_path, ring, ulysses)
    for rank, out in enumerate(outs):
        assert set(out["patches"].values()) == {"applied"}, out["patches"]
        assert out["cpu_fallbacks"] == {}, out
        for case in out["cases"]:
            if rank == 0:
                print("ring %d x Ulysses %d, %s, %d rows -> %d: max |diff| %.4g of %.3g, %d fused kernels"
                      % (ring, ulysses, case["model"], case["rows"], case["padded"], case["max_abs"],
                         case["max_ref"], case["fusion_attention"]))
            assert case["finite"], case
            assert case["max_abs"] <= BF16_STEPS * case["max_ref"], (rank, case)
            # each ring step is one fused kernel, but a block of padding alone launches none
            assert 0 < case["fusion_attention"] <= ring, (rank, case)


def test_without_the_patches_the_padded_keys_change_the_attention(bed_python, tmp_path):
    """What raylight does on every device, here on ring 2 x Ulysses 2: where the 4 cards divide the
    sequence its real rows are one card's attention; where they pad it, the zero keys take a share of
    every softmax (3 of 8 keys for 5 rows: a third of the output's magnitude), which the bound sees
    from 97 rows down (2 of 188 keys for 186 rows move it by about one bf16 step)."""
    (out, *_) = ranks(bed_python, tmp_path, 2, 2, ASCEND_SHIM_DISABLE="raylight_minimax_keys,raylight_wan_keys")
    for case in out["cases"]:
        print("unpatched ring 2 x Ulysses 2, %s, %d rows -> %d: max |diff| %.4g of %.3g"
              % (case["model"], case["rows"], case["padded"], case["max_abs"], case["max_ref"]))
        if case["rows"] == case["padded"]:
            assert case["max_abs"] <= BF16_STEPS * case["max_ref"], case
        elif case["rows"] <= 97:
            assert case["max_abs"] > BF16_STEPS * case["max_ref"], case
    short = [case for case in out["cases"] if case["rows"] == 5]
    assert len(short) == 2 and all(case["max_abs"] > 0.2 * case["max_ref"] for case in short), short
