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


def _comfyui_qk(qkv, d, table, eps):
    """ComfyUI's q and k after its norms and rotation (``Attention.forward``), in float64."""
    q, k, _ = torch.chunk(qkv, 3, dim=-1)
    q, k = (torch.nn.functional.rms_norm(t, (d,), None, eps) for t in (q, k))
    if table is not None:
        q, k = (vit_blocks.split_half_reference(t, table) for t in (q, k))
    return q, k


def _gathered_qk(qkv, d, table, eps):
    """The fused path's q and k: one gather, one norm, one rotary as ``npu_rotary_mul`` documents it."""
    b, s, heads = qkv.shape[:3]
    rot = 2 * table.shape[-3] if table is not None else 0

    def norm(t):
        return torch.nn.functional.rms_norm(t, (d,), None, eps)

    index = vit_blocks.qk_order(heads, d, rot)
    if table is None:
        return vit_blocks.normed_rotated_qk(qkv.flatten(2), index, d, norm)
    r1, r2 = rope.rotary_coefficients(table, split_half=True, width=d)
    assert r1.shape == (b, s, 1, d)
    return vit_blocks.normed_rotated_qk(qkv.flatten(2), index, d, norm, _documented_rotary, r1, r2)


def _documented_rotary(x, r1, r2, mode):
    assert mode == "half" and x.is_contiguous()
    return rope.rotate_reference(x, r1, r2, split_half=True)


def test_head_order_puts_each_rotated_pair_half_a_head_apart():
    order = vit_blocks.head_order(64, 48)  # the decoder's heads: 48 of 64 channels rotated
    assert sorted(order) == list(range(64))
    assert [order[i + 32] - order[i] for i in range(24)] == [24] * 24  # ComfyUI's pair (i, i + 24)
    assert order[24:32] == list(range(48, 56)) and order[56:] == list(range(56, 64))
    assert vit_blocks.head_order(8, 0) == list(range(8)) and vit_blocks.head_order(8, 8) == list(range(8))
    index = vit_blocks.qk_order(2, 4, 2)  # heads [q0 k0 v0 | q1 k1 v1] of 4 channels, one rotated pair
    assert index.tolist() == [0, 2, 1, 3, 4, 6, 5, 7, 12, 14, 13, 15, 16, 18, 17, 19]


def test_gathered_normed_rotated_qk_is_comfyuis_in_head_order_and_gives_its_scores():
    """The documented ops in float64 as the ops: what is left is the layout and the channel order."""
    torch.manual_seed(0)
    b, s, h, d, pairs, eps = 1, 7, 3, 64, 24, 1e-5
    qkv = torch.randn(b, s, h, 3 * d, dtype=torch.float64) * 4
    for table in (_table(b, s, pairs, torch.float64), None):
        want_q, want_k = _comfyui_qk(qkv, d, table, eps)
        got_q, got_k = _gathered_qk(qkv, d, table, eps)
        order = vit_blocks.head_order(d, 2 * pairs if table is not None else 0)
        assert torch.allclose(got_q, want_q[..., order], rtol=1e-12, atol=1e-12)
        assert torch.allclose(got_k, want_k[..., order], rtol=1e-12, atol=1e-12)
        # attention sees q . k per head: the same sums, in another order
        scores = torch.einsum("bshd,bthd->bhst", got_q, got_k)
        assert torch.allclose(scores, torch.einsum("bshd,bthd->bhst", want_q, want_k), rtol=1e-12, atol=1e-10)
    # ComfyUI's layout alone (no reorder) would pair the wrong channels: the order is what makes it right
    plain = vit_blocks.qk_order(h, d, 0)
    qk = torch.index_select(qkv.flatten(2), -1, plain).view(b, s, 2 * h, d)
    r1, r2 = rope.rotary_coefficients(_table(b, s, pairs, torch.float64), split_half=True, width=d)
    assert not torch.allclose(rope.rotate_reference(qk, r1, r2, True).view(b, s, h, 2, d)[..., 0, :],
                              want_q, atol=1e-3)


def test_rotary_coefficients_wider_than_the_table_pass_the_rest_unchanged():
    torch.manual_seed(2)
    table = _table(2, 5, 3, torch.float64)
    n1, n2 = rope.rotary_coefficients(table, split_half=True)
    w1, w2 = rope.rotary_coefficients(table, split_half=True, width=10)
    assert torch.equal(w1[..., [0, 1, 2, 5, 6, 7]], n1) and torch.equal(w2[..., [0, 1, 2, 5, 6, 7]], n2)
    assert torch.all(w1[..., [3, 4, 8, 9]] == 1) and torch.all(w2[..., [3, 4, 8, 9]] == 0)
    assert torch.equal(rope.rotary_coefficients(table, split_half=True, width=6)[0], n1)
    for bad in (7, 4):
        try:
            rope.rotary_coefficients(table, split_half=True, width=bad)
        except ValueError as exc:
            assert "even and at least 6" in str(exc)
        else:
            raise AssertionError("width %d accepted" % bad)


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
    fused = sys.modules.get("ascend_shim.patches.comfyui.fused.minimax_vae")
    decode_calls = dict(fused.PATHS.calls) if fused is not None else {}
    torch.save(frames.float().cpu(), os.environ["FRAMES_OUT"])
    state = {p["name"]: p for p in hook.engine().status()["patches"]}["minimax_vae_fused"]
    out = {"state": state["state"], "kernels": device_work.kernels(aten, npu), "npu_ops": npu,
           "fallbacks": dict(nd.cpu_fallbacks())}
    # one decoder block on the card, as the decode's blocks run it (after one warm call: probes,
    # the coefficients of the forward's table): its kernels by op
    decoder = vae.first_stage_model.decoder
    block = decoder.transformer_blocks[0]
    dim = block.norm1.weight.shape[0]
    device, dtype = block.norm1.weight.device, block.norm1.weight.dtype
    table = decoder.pos_embed(video.create_token_ids((2, 3, 3), device, dtype))
    h = torch.randn(1, 18, dim, generator=torch.Generator().manual_seed(6)).to(device, dtype)
    scope = fused.PATHS.enter_decoder() if fused is not None else None
    with torch.inference_mode():
        block(h.clone(), table)
        fresh = h.clone()  # the block adds into its input
        tb.reset()
        nd.reset_op_counts(enable=True)
        block(fresh, table)
        out["block_ops"] = {k: v for k, v in dict(nd.op_counts()).items()
                            if device_work.kernels({k: v})}
        out["block_ops"].update(dict(tb.calls))
        nd.reset_op_counts(enable=False)
    if fused is not None:
        fused.PATHS.leave_decoder(scope)
    if fused is not None and state["state"] == "applied":
        out["calls"] = decode_calls
        # the same block on the CPU: ComfyUI's forward, no NPU op
        cpu_block = type(block)(heads=2, dim_head=32)
        cpu_block.load_state_dict({k: v.float().cpu() for k, v in block.state_dict().items()})
        x = torch.randn(1, 10, 64)
        before, paths_before = dict(tb.calls), dict(fused.PATHS.calls)
        with torch.inference_mode():
            cpu_block(x)
        out["cpu_npu_ops"] = {k: v - before.get(k, 0) for k, v in tb.calls.items() if v != before.get(k, 0)}
        out["cpu_calls"] = {k: v - paths_before.get(k, 0) for k, v in fused.PATHS.calls.items()
                            if v != paths_before.get(k, 0)}
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
    assert on["kernels"] < off["kernels"], (on["kernels"], off["kernels"], blocks)
    # a block: 4 linears, 2 block norms, the q/k gather, one norm and one rotary for q and k of all
    # heads, SDPA, ComfyUI's nan_to_num_, 2 residual addcmul_, one swiglu: 14 kernels, no copy
    assert sum(on["block_ops"].values()) == 14, on["block_ops"]
    assert on["block_ops"] == {"aten::addmm": 4, "npu_rms_norm": 3, "aten::index_select": 1, "npu_rotary_mul": 1,
                               "aten::scaled_dot_product_attention": 1, "aten::nan_to_num_": 1,
                               "aten::addcmul_": 2, "npu_swiglu": 1}, on["block_ops"]
    # ComfyUI's block without the patch: 2 q/k norms on strided chunks (a copy each), kitchen's rope
    # (a copy and a rotary each for q and k) and the copies back, silu + mul
    assert sum(off["block_ops"].values()) >= 14 + 8, off["block_ops"]
    # CPU tensors: ComfyUI's own forward, no torch_npu op
    assert on["cpu_npu_ops"] == {}, on["cpu_npu_ops"]
    assert on["cpu_calls"] == {"attention declined: not a 3-D NPU tensor": 1,
                               "gated silu declined: not an NPU float tensor": 1}, on["cpu_calls"]
    print(json.dumps({"on": on, "off": off, "cosine": float(cosine)}))
