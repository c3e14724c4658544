"""The MiniMax-H3 video VAE decoder on torch_npu's fused ops (patch ``minimax_vae_fused``).

The math (``ascend_shim/npu_math/vit_blocks.py``) against float64 references on the CPU; the
patch in fresh interpreters of the simulated Ascend bed: a tiny MiniMax-H3 video VAE decode on
ComfyUI v0.30.0 gives the same frames in fewer kernels with it, routes through the fused ops only
for NPU tensors, and ``ASCEND_SHIM_DISABLE=minimax_vae_fused`` restores ComfyUI's path.
"""

import json
import sys
from pathlib import Path

import torch

TESTS = Path(__file__).resolve().parent
sys.path.insert(0, str(TESTS))

import harness  # noqa: E402
from ascend_shim.npu_math import rope, vit_blocks  # noqa: E402


def _table(b, s, pairs, dtype):
    angles = torch.rand(b, s, pairs, dtype=torch.float64) * 6.3
    c, sn = torch.cos(angles), torch.sin(angles)  # ComfyUI's RotaryEmbeddingND layout: [[c, -s], [s, c]]
    return torch.stack((c, -sn, sn, c), dim=-1).reshape(b, s, 1, pairs, 2, 2).to(dtype)


def test_qk_pairs_are_chunks_q_and_k_of_qkv():
    qkv = torch.randn(2, 5, 3, 3 * 8)
    q, k, _ = torch.chunk(qkv, 3, dim=-1)
    qk = vit_blocks.qk_pairs(qkv, 8)
    assert qk.shape == (2, 5, 3, 2, 8) and qk.data_ptr() == qkv.data_ptr()
    assert torch.equal(qk[..., 0, :], q) and torch.equal(qk[..., 1, :], k)


def test_rotate_in_place_is_the_split_half_rotation_of_the_table():
    # the documented npu_rotary_mul in float64 as the op: what is left is the layout
    torch.manual_seed(0)
    b, s, h, d, pairs = 1, 7, 3, 32, 12
    table = _table(b, s, pairs, torch.float64)
    qk = torch.randn(b, s, h, 2, d, dtype=torch.float64)
    want = vit_blocks.split_half_reference(qk, table.unsqueeze(3))  # per head, q and k
    r1, r2 = rope.rotary_coefficients(table, split_half=True)

    def rotary(x, c, sn, mode):
        assert mode == "half" and x.is_contiguous() and x.shape == (b, s, 2 * h, 2 * pairs)
        return rope.rotate_reference(x, c, sn, split_half=True)

    got = qk.clone()
    vit_blocks.rotate_in_place(rotary, got, r1, r2, 2 * pairs)
    assert torch.allclose(got, want, rtol=1e-12, atol=1e-12)
    assert torch.equal(got[..., 2 * pairs:], qk[..., 2 * pairs:])  # the channels past rot stay


def test_gated_silu_is_comfyuis_gate_and_near_float64():
    torch.manual_seed(1)
    h = torch.randn(4, 9, 2 * 16, dtype=torch.float64) * 3
    a, b = h.chunk(2, dim=-1)
    want = torch.nn.functional.silu(a) * b
    assert torch.allclose(vit_blocks.gated_silu(h.clone()), want, rtol=1e-12, atol=0)
    got = vit_blocks.gated_silu(h.half()).double()
    assert torch.allclose(got, want, rtol=2 ** -9, atol=2 ** -14)


def test_a_comfyui_that_rewrites_the_forwards_keeps_them():
    """The fused math is ComfyUI v0.30.0's (and v0.33.0's) Attention/FeedForward forward; a release
    that rewrites one (modelled here: a forward with one more step) keeps its own."""
    import types

    from ascend_shim.patches.comfyui.fused import minimax_vae

    class Attention:
        def forward(self, x, rotary_pos_emb=None):
            return x * 2

    class FeedForward:
        def forward(self, x):
            return x

    rewritten = types.SimpleNamespace(Attention=Attention, FeedForward=FeedForward)
    reason = minimax_vae.unchecked_forward(rewritten)
    assert reason and reason.startswith("this ComfyUI's MiniMax-H3 VAE Attention.forward is not"), reason
    assert minimax_vae.forward_text(Attention) not in minimax_vae.CHECKED_FORWARDS["Attention"]
    assert minimax_vae.forward_text(FeedForward) == minimax_vae.forward_text(FeedForward)  # stable


SCENARIO = """
    import json, os, sys, warnings
    warnings.simplefilter("ignore")
    import torch
    import comfy.model_management as mm
    import comfy.sd
    import comfy.ldm.minimax.vae as video
    import torch_npu
    from testbed import device_work, npu_device as nd
    sys.path.insert(0, os.path.join(os.environ["TESTS_DIR"], "e2e"))
    import tiny_vaes
    from ascend_shim.startup import hook

    tiny_vaes.model_minimax_vaes_at_tiny_width()
    vae = comfy.sd.VAE(sd=tiny_vaes.minimax_video_vae())
    latent = torch.randn(1, 24, 3, 16, 16, generator=torch.Generator().manual_seed(5))
    tb = torch_npu._testbed
    tb.reset()
    nd.reset_op_counts(enable=True)
    with torch.inference_mode():
        frames = vae.decode(latent)
    aten, npu = dict(nd.op_counts()), dict(tb.calls)
    nd.reset_op_counts(enable=False)
    torch.save(frames.float().cpu(), os.environ["FRAMES_OUT"])
    state = {p["name"]: p for p in hook.engine().status()["patches"]}["minimax_vae_fused"]
    out = {"state": state["state"], "kernels": device_work.kernels(aten, npu), "npu_ops": npu,
           "fallbacks": dict(nd.cpu_fallbacks())}
    fused = sys.modules.get("ascend_shim.patches.comfyui.fused.minimax_vae")
    if fused is not None and state["state"] == "applied":
        out["calls"] = dict(fused.PATHS.calls)
        # the same block on the CPU: ComfyUI's forward, no NPU op
        block = vae.first_stage_model.decoder.transformer_blocks[0]
        cpu_block = type(block)(heads=2, dim_head=32)
        cpu_block.load_state_dict({k: v.float().cpu() for k, v in block.state_dict().items()})
        x = torch.randn(1, 10, 64)
        before = dict(tb.calls)
        with torch.inference_mode():
            cpu_block(x)
        out["cpu_npu_ops"] = {k: v - before.get(k, 0) for k, v in tb.calls.items() if v != before.get(k, 0)}
        out["cpu_calls"] = {k: v - out["calls"].get(k, 0) for k, v in fused.PATHS.calls.items()
                            if v != out["calls"].get(k, 0)}
    print(json.dumps(out))
"""


def _decode(run_bed, bed_python, tmp_path, name, **env):
    frames = tmp_path / (name + ".pt")
    proc = run_bed(SCENARIO, comfy=harness.comfyui_dir(harness.COMFYUI_USER), kitchen=harness.COMFYUI_USER_KITCHEN,
                   extra_path=[harness.stand_ins(tmp_path / "stand-ins", bed_python)],
                   FRAMES_OUT=str(frames), TESTS_DIR=str(TESTS), **env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return harness.last_json(proc), torch.load(frames)


def test_tiny_decode_same_frames_fewer_kernels_and_the_old_path_when_disabled(run_bed, bed_python, tmp_path):
    on, frames_on = _decode(run_bed, bed_python, tmp_path, "on")
    off, frames_off = _decode(run_bed, bed_python, tmp_path, "off", ASCEND_SHIM_DISABLE="minimax_vae_fused")
    assert on["state"] == "applied" and off["state"] == "disabled", (on["state"], off["state"])
    assert on["fallbacks"] == {} and off["fallbacks"] == {}
    cosine = torch.nn.functional.cosine_similarity(frames_on.flatten().double(), frames_off.flatten().double(), dim=0)
    assert frames_on.shape == frames_off.shape and cosine >= 0.9999, float(cosine)
    # the fused ops ran with the patch, ComfyUI's path (kitchen's rope, silu + mul) without it
    assert on["npu_ops"].get("npu_swiglu", 0) > 0 and off["npu_ops"].get("npu_swiglu", 0) == 0
    blocks = on["calls"]["attention fused"]
    assert blocks == on["calls"]["gated silu fused"] and blocks > 0, on["calls"]
    # (each count holds its op's one-call probes, the same with and without the patch)
    assert off["npu_ops"]["npu_rotary_mul"] - on["npu_ops"]["npu_rotary_mul"] == blocks, (on, off)
    assert on["npu_ops"]["npu_rms_norm"] == off["npu_ops"]["npu_rms_norm"] - blocks
    # 6 fewer per block (2 copies and a norm, a copy and a rotary, the copies back, silu + mul), less
    # the fixed cost of the patch's two probes
    assert on["kernels"] <= off["kernels"] - 5 * blocks, (on["kernels"], off["kernels"], blocks)
    # CPU tensors: ComfyUI's own forward, no torch_npu op
    assert on["cpu_npu_ops"] == {}, on["cpu_npu_ops"]
    assert on["cpu_calls"] == {"attention declined: not a 3-D NPU tensor": 1,
                               "gated silu declined: not an NPU float tensor": 1}, on["cpu_calls"]
    print(json.dumps({"on": on, "off": off, "cosine": float(cosine)}))
