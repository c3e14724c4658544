"""Every XFuser_attention choice of raylight's RayInitializer on the NPUs (patch ``raylight_attention``), two ranks.

RayInitializer offers every member of yunchang's ``AttnType``. Each rank is a fresh interpreter
of a venv the wheel was installed into, on its own simulated card (ComfyUI v0.30.0, raylight
1.7.2 as its worker imports it), in an ``hccl`` world of 2. It sets up xfuser's groups with
raylight's own ``initialize_xfuser_parallel`` (Ulysses 2, as a worker does), then for each
choice does what raylight's xDiT model files do when they load: ``set_attn_type(choice)``, then
``make_xfuser_attention(choice, sync_ulysses)``, and runs that attention on this rank's half of
the sequence of a seeded bf16 q/k/v, given as raylight's ComfyUI hook takes them
(``[B, S/2, heads * dim]`` npu tensors and ``heads``). Its half of the output is compared with
torch's SDPA of the full q/k/v on one card; the bed's SDPA paths, its CPU fallbacks and this
rank's HCCL collectives are counted per choice.

With the patch every choice runs as ``TORCH_MATH``: the same output, torch_npu's fused SDPA,
the Ulysses all-to-alls over HCCL. Without it the CUDA/ROCm choices stop inside yunchang or
xfuser and ``TORCH_FLASH`` (raylight's default) reaches an aten op torch_npu does not register.

The one-card bound: the bed computes torch_npu's fused SDPA with torch's CPU SDPA, under the
caller's ``sdpa_kernel`` hint (yunchang's ``TORCH_MATH`` asks for the math backend, ComfyUI's
one-card attention for none), where a real card's op-plugin ignores the hint; the two CPU
kernels round bf16 differently by at most one step of the output's magnitude (|out| < 2 here).
"""

import pytest

import harness

ONE_BF16_STEP = 2.0 ** -7  # the spacing of bf16 values in [1, 2): one rounding step
CHOICES = ("AITER", "FA", "FA3", "FLASHINFER", "TORCH_MATH", "TORCH_FLASH", "TORCH_EFFICIENT", "TORCH_CUDNN",
           "SAGE_AUTO", "SAGE_FP16", "SAGE_FP16_TRITON", "SAGE_FP8", "SAGE_FP8_SM90", "SPARSE_SAGE", "NPU")

pytestmark = [
    pytest.mark.skipif(not harness.torch_available(), reason="torch is not installed"),
    pytest.mark.skipif(not harness.raylight_available(), reason="ray/xfuser/yunchang are not installed "
                       "(tests/requirements-raylight.txt)"),
]

RANK = r'''
import json, os, sys
from datetime import timedelta
from testbed.absent_packages import stand_in_for

stand_in_for(("torchvision", "torchaudio"))
import torch, torch_npu
import torch.distributed as dist
from testbed import hccl, npu_device

rank = int(os.environ["RANK"])
torch.npu.set_device(0)
dist.init_process_group("hccl", init_method="file://" + os.environ["STORE"], rank=rank, world_size=2,
                        timeout=timedelta(seconds=60))
from raylight.distributed_worker.parallel_group_manager import initialize_xfuser_parallel
from raylight.distributed_modules import attention as raylight_attention
from yunchang.kernels import AttnType

B, S, HEADS, DIM = 1, 64, 4, 32
generator = torch.Generator().manual_seed(7)
q, k, v = (torch.randn(B, S, HEADS * DIM, generator=generator).to(torch.bfloat16).to("npu") for _ in range(3))
bnsd = lambda t: t.view(B, S, HEADS, DIM).transpose(1, 2)
# one card: ComfyUI's attention (torch SDPA) of the whole sequence
one_card = torch.nn.functional.scaled_dot_product_attention(bnsd(q), bnsd(k), bnsd(v))
one_card = one_card.transpose(1, 2).reshape(B, S, HEADS * DIM)
half = slice(rank * S // 2, (rank + 1) * S // 2)  # this rank's half of the sequence (raylight's USP split)

context = initialize_xfuser_parallel(local_rank=rank, world_size=2, parallel_dict={
    "is_xdit": True, "attention": "TORCH_FLASH", "sync_ulysses": False, "ulysses_degree": 2})
out = {"ulysses": context.config.ulysses_degree, "sequence_world": context.sequence_world_size,
       "members": list(AttnType.__members__), "choices": {}}
outputs = {}
for name in AttnType.__members__:
    torch_npu._testbed.sdpa_paths.clear()
    npu_device.reset_cpu_fallbacks()
    hccl.reset_collective_bytes()
    got = {}
    try:
        raylight_attention.set_attn_type(name)  # what RayInitializer's choice becomes in the worker
        got["attn_type"] = raylight_attention.get_attn_type()
        attention = raylight_attention.make_xfuser_attention(name, raylight_attention.get_sync_ulysses())
        result = attention(q[:, half], k[:, half], v[:, half], HEADS)
        got["device"], got["shape"] = str(result.device), list(result.shape)
        got["max_abs"] = (result.float() - one_card[:, half].float()).abs().max().item()
        outputs[name] = result.cpu()
    except Exception as exc:  # what raylight's worker would raise with this choice
        got["error"] = "%s: %s" % (type(exc).__name__, (str(exc).strip().splitlines() or [""])[0].split(". ")[0])
    got["sdpa_paths"] = dict(torch_npu._testbed.sdpa_paths)
    got["cpu_fallbacks"] = dict(npu_device.cpu_fallbacks())
    got["collectives"] = {kind: counts["calls"] for (card, kind), counts in hccl.collective_bytes().items()}
    out["choices"][name] = got
for name, result in outputs.items():  # every choice that ran, against TORCH_MATH's output
    out["choices"][name]["vs_torch_math"] = (result.float() - outputs["TORCH_MATH"].float()).abs().max().item()
out["patch"] = {r["name"]: r["state"] for r in __import__("ascend_shim").status()["patches"]}["raylight_attention"]
dist.destroy_process_group()
print(json.dumps(out))
'''


def _ranks(bed_python, tmp_path, **env):
    return harness.raylight_ranks(bed_python, tmp_path, RANK, **env)


def test_every_attention_choice_runs_ulysses_on_the_npus(bed_python, tmp_path):
    for rank, out in enumerate(_ranks(bed_python, tmp_path)):
        assert out["patch"] == "applied"
        assert (out["ulysses"], out["sequence_world"]) == (2, 2), out
        assert tuple(out["members"]) == CHOICES, out["members"]  # the choices RayInitializer offers
        for name, got in out["choices"].items():
            assert "error" not in got, (rank, name, got)
            assert got["attn_type"] == "TORCH_MATH", (rank, name, got)
            assert got["device"] == "npu:0" and got["shape"] == [1, 32, 128], (rank, name, got)
            assert got["max_abs"] <= ONE_BF16_STEP, (rank, name, got)  # this rank's half of the one-card output
            assert got["vs_torch_math"] == 0.0, (rank, name, got)  # one kernel for every choice
            assert got["sdpa_paths"] == {"fused": 1}, (rank, name, got)  # heads/2 x the whole sequence, once
            assert got["cpu_fallbacks"] == {}, (rank, name, got)
            # Ulysses: q, k, v scattered by heads and the output gathered back, over HCCL
            assert got["collectives"] == {"all_to_all_single": 4}, (rank, name, got)


def test_without_the_patch_the_choices_stop_on_the_npus(bed_python, tmp_path):
    outs = _ranks(bed_python, tmp_path, ASCEND_SHIM_DISABLE="raylight_attention")
    for rank, out in enumerate(outs):
        choices = out["choices"]
        assert out["patch"] == "disabled"
        assert choices["TORCH_FLASH"]["attn_type"] == "TORCH_FLASH"
        # raylight's default: torch_npu registers no NPU kernel for it (a card runs it on the CPU; the bed refuses)
        assert choices["TORCH_FLASH"]["error"] == ("NotImplementedError: Could not run "
                                                   "'aten::_scaled_dot_product_flash_attention' with arguments "
                                                   "from the 'CPU' backend"), choices["TORCH_FLASH"]
        assert choices["TORCH_FLASH"]["cpu_fallbacks"] == {"aten::_scaled_dot_product_flash_attention": 1}
        assert choices["TORCH_FLASH"]["sdpa_paths"] == {}
        assert choices["FA"]["error"] == "AssertionError: FlashAttention is not available", choices["FA"]
        assert choices["SAGE_AUTO"]["error"] == "ImportError: SageAttention is not available!", choices["SAGE_AUTO"]
        assert choices["NPU"]["error"].startswith("ImportError: cannot import name 'xdit_ring_npu_flash_attn_func' "
                                                  "from 'xfuser.core.long_ctx_attention.ring'"), choices["NPU"]
        assert choices["NPU"]["collectives"] == {}  # stops when raylight builds it
        # the choice the patch maps every other to runs as it does with the patch
        assert "error" not in choices["TORCH_MATH"] and choices["TORCH_MATH"]["max_abs"] <= ONE_BF16_STEP
