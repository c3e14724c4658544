"""One MiniMax-H3 step (or its video or audio decode, or its text encode) at the user's size on the simulated 910B,
without computing it.

    python real_size_case.py <comfyui-dir> --part dit|vae|audio|te [--variant int8|bf16] [--text-len 256]
                             [--width 864 --height 480 --length 121] [--cfg 1|2]
                             [--ulysses N --raylight <raylight>/src]

Run by ``real_size.py`` in a fresh interpreter on the bed (``ASCEND_TESTBED=ascend-cu130``, the
shim and a comfy-kitchen on the path). ComfyUI's own classes (v0.30.0's) are built at the size of the
published model (``MiniMaxH3Model``'s defaults, which ComfyUI's model detection reads back from the
checkpoint's shapes) and loaded with ComfyUI's own loader; every large tensor carries no data:

* the bed's ``NpuTensor`` wraps a ``FakeTensor`` (meta storage, real sizes, strides and dtypes)
  instead of a CPU tensor, so every op on an npu tensor still goes through the bed's dispatcher,
  its CPU-fallback and composite-op rules, the torch_npu ops' checks and the shim's kernels, and
  ends in a meta kernel;
* small tensors (under ``BIG`` elements: timesteps, tables, layouts) keep real data, so the
  model's Python-side decisions (``float(sigma)``, the packed layout) run as they do for the user.

Every aten op reaching the bed on npu tensors and every torch_npu op call is counted with its
device bytes (inputs read + outputs written, broadcast inputs once) and FLOPs, and attributed
to an op class by the Python frames it was called from (the ComfyUI module or function).

``--ulysses N``: the DiT step as rank 0 of N cards under raylight's Ulysses split (``rank0_of_ulysses``):
raylight's own MiniMax-H3 forward and attention, xfuser's and yunchang's own groups on torch's fake
process group, the collectives counted (bytes this card sends) instead of run.

``--share N`` (``--part vae``): the video decode as worker 0 of N cards under raylight's
``RayVAEDecodeDistributed`` with the shim (``distributed.tile_share``, as ``raylight_vae_share`` calls it):
worker 0 computes its share of the tiles and blends them all; the other workers' tiles are counted as
bytes received (``RankZeroOf``), not computed here. Prints one JSON object.
"""

import argparse
import collections
import json
import math
import os
import sys
import time

START = time.monotonic()
import io  # noqa: E402
import logging  # noqa: E402

log_stream = io.StringIO()
logging.basicConfig(level=logging.INFO, stream=log_stream, format="%(name)s %(levelname)s %(message)s")
parser = argparse.ArgumentParser()
parser.add_argument("comfy_dir")
parser.add_argument("--part", choices=("dit", "vae", "audio", "te"), default="dit")
parser.add_argument("--variant", choices=("int8", "bf16"), default="int8")
parser.add_argument("--text-len", type=int, default=256)
parser.add_argument("--width", type=int, default=864)
parser.add_argument("--height", type=int, default=480)
parser.add_argument("--length", type=int, default=121)
parser.add_argument("--npu-schemas", metavar="FILE")
parser.add_argument("--ulysses", type=int, default=0, metavar="N",
                    help="run raylight's Ulysses forward as rank 0 of N cards (0: ComfyUI's own forward)")
parser.add_argument("--raylight", metavar="SRC", help="raylight's src folder (with --ulysses)")
parser.add_argument("--share", type=int, default=0, metavar="N",
                    help="with --part vae: the decode as worker 0 of N cards under raylight's distributed decode "
                         "(the shim's raylight_vae_share), the other workers' tiles counted as they arrive")
parser.add_argument("--cfg", type=int, choices=(1, 2), default=1,
                    help="forwards per step: 1 (BasicGuider, the MiniMax-H3 templates) or 2 (a CFG guider)")
OPTS = parser.parse_args()

sys.path.insert(0, OPTS.comfy_dir)
sys.argv = [os.path.join(OPTS.comfy_dir, "main.py")]
if OPTS.npu_schemas:  # before comfy-kitchen loads: upstream's ascend backend reads the schemas at import
    import torch_npu

    from testbed import torch_ops_packets

    packets = torch_ops_packets.serve_from_file(torch_npu, OPTS.npu_schemas)

from testbed.absent_packages import stand_in_for  # noqa: E402

stand_in_for(("torchvision", "torchaudio"))
import comfy.options  # noqa: E402

comfy.options.enable_args_parsing()
import comfy.model_management as mm  # noqa: E402
import torch  # noqa: E402
import torch_npu  # noqa: E402
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402
from torch.utils._pytree import tree_flatten  # noqa: E402

from testbed import device_account, npu_device  # noqa: E402

BIG = 1 << 18  # tensors with at least this many elements carry no data
FAKE = FakeTensorMode(allow_non_fake_inputs=True)
NPU = torch.device("npu", 0)


class DataLess(TorchDispatchMode):
    """Large tensors become fake; ops on npu tensors are left to the bed (which meets this mode
    again for the op on the wrapped tensors). With ``meta`` set, large host tensors are meta ones
    (parameters that torch's Module._apply would have to swap if they were fake)."""

    meta = False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        flat = tree_flatten((args, kwargs))[0]
        tensors = device_account.tensors_in(flat)
        if any(isinstance(t, npu_device.NpuTensor) or type(t) not in (torch.Tensor, torch.nn.Parameter, FakeTensor)
               for t in tensors):
            return NotImplemented  # npu tensors and other subclasses (kitchen's QuantizedTensor) first
        device = kwargs.get("device")
        to_npu = isinstance(device, torch.device) and device.type == "npu"
        if any(t.device.type == "meta" and not isinstance(t, FakeTensor) for t in tensors):
            if not isinstance(device, torch.device) or device.type == "meta":
                return func(*args, **kwargs)
            # a meta tensor moved to the host or the device: a fake CPU tensor of the same geometry
            meta = func(*args, **dict(kwargs, device=torch.device("meta")))
            with FAKE:
                out = torch.empty_strided(meta.shape, meta.stride(), dtype=meta.dtype)
            return npu_device.NpuTensor(out, device.index or 0) if to_npu else out
        if to_npu:  # a factory or a host-to-device copy: an npu tensor over a CPU (or fake) one
            kwargs = dict(kwargs, device=torch.device("cpu"))
        if any(isinstance(t, FakeTensor) for t in tensors):
            with FAKE:
                out = func(*args, **kwargs)
        elif tensors:  # small real inputs (large ones are fake): computed
            out = func(*args, **kwargs)
        else:  # a factory: data-less when large
            with FAKE:
                probe = func(*args, **kwargs)
            small = all(t.numel() < BIG for t in device_account.tensors_in(tree_flatten(probe)[0]))
            if small:
                out = func(*args, **kwargs)
            elif self.meta and not to_npu:
                out = func(*args, **dict(kwargs, device=torch.device("meta")))
            else:
                out = probe
        if to_npu:
            return npu_device.NpuTensor(out, device.index or 0) if isinstance(out, torch.Tensor) else out
        return out


# --------------------------------------------------------------------------- accounting

CLASSES = ("attention", "quantized linears", "other linears", "convolutions", "norms", "modulation",
           "RoPE", "activation", "Ulysses glue", "elementwise glue", "other")
# innermost frame that names the op's purpose: function name -> class
FUNCTIONS = {
    "_mod_scale_shift": "modulation", "_mod_gate": "modulation",
    "rms_rope_split_half_": "RoPE", "rms_rope_split_half": "RoPE", "rope_rotation_table": "RoPE",
    "rope_freqs": "RoPE", "apply_rope": "RoPE", "apply_rope1": "RoPE",
    "optimized_attention": "attention", "attention_pytorch": "attention", "attention_basic": "attention",
    "apply_input_act": "activation", "silu": "activation", "gelu": "activation",
    "group_norm": "norms", "layer_norm": "norms", "rms_norm": "norms",
    "int8_linear": "quantized linears",
    # raylight's Ulysses forward (--ulysses): its attention wrapper reshapes as attention_pytorch does; its
    # rope is kitchen's apply_rope_split_half written back into q and k; what Ulysses adds around each
    # card's SDPA (yunchang's all-to-all layouts, xfuser's ring step of one, the padding and the split)
    "_attention_xfuser_unmask": "attention", "apply_rope_split_half": "RoPE", "usp_attn_forward": "RoPE",
    "all_to_all_4D": "Ulysses glue", "pytorch_attn_forward": "Ulysses glue", "update_out_and_lse": "Ulysses glue",
    "xdit_ring_flash_attn_forward": "Ulysses glue", "pad_to_size": "Ulysses glue",
    "_split_packed_sequence": "Ulysses glue",
    # the shim's minimax_vae_fused patch: its attention forward (the q/k gather among it) and the coefficients
    "_fused_attention": "attention", "rotary_coefficients": "RoPE",
}
MODULES = {"RMSNorm": "norms", "GroupNorm": "norms", "LayerNorm": "norms", "TemporalIsolatedGroupNorm": "norms",
           "AdalnProj": "modulation", "FinalLayer": "modulation", "TimeEmbedder": "other",
           "Conv3d": "convolutions", "Conv2d": "convolutions", "Conv1d": "convolutions",
           "CausalConv3d": "convolutions", "RotaryEmbeddingND": "RoPE", "Attention": "attention"}


def _frame_class():
    frame = sys._getframe(3)
    while frame is not None:
        name = frame.f_code.co_name
        if name in FUNCTIONS:
            return FUNCTIONS[name]
        if name == "forward":
            owner = frame.f_locals.get("self")
            kind = type(owner).__name__ if owner is not None else ""
            if kind in MODULES:
                return MODULES[kind]
            if kind == "Linear" or kind.endswith("Linear"):
                weight = getattr(owner, "weight", None)
                return "quantized linears" if type(weight).__name__ == "QuantizedTensor" else "other linears"
        frame = frame.f_back
    return "elementwise glue"


NPU_CLASSES = {"npu_dynamic_quant": "quantized linears", "npu_quant_matmul": "quantized linears",
               "npu_rotary_mul": "RoPE", "npu_rms_norm": "norms", "npu_swiglu": "activation",
               "npu_group_norm_silu": "norms"}
ACCOUNT = device_account.Account(classify=_frame_class, npu_classes=NPU_CLASSES).install()


def start_counting():
    COLLECTIVES.clear()
    torch_npu._testbed.reset()
    npu_device.reset_cpu_fallbacks()
    npu_device.reset_op_counts(enable=True)
    ACCOUNT.start()


def stop_counting():
    rows = ACCOUNT.stop()
    aten = dict(npu_device.op_counts())
    npu_device.reset_op_counts(enable=False)
    return {"rows": rows, "aten_ops": aten,
            "npu_ops": dict(torch_npu._testbed.calls), "fallbacks": dict(npu_device.cpu_fallbacks()),
            "sdpa_paths": dict(torch_npu._testbed.sdpa_paths), "collectives": {k: list(v) for k, v in COLLECTIVES.items()},
            "errors": [list(e) for e in torch_npu._testbed.errors][:5]}


report = {"part": OPTS.part, "variant": OPTS.variant, "torch": torch.__version__,
          "device": str(mm.get_torch_device())}
if "ascend_shim.engine.runner" in sys.modules:
    import ascend_shim

    report["shim"] = {row["name"]: row["state"] for row in ascend_shim.status()["patches"]}


def fill(shape, dtype, key=""):
    """A tensor of ``shape``: data-less when large, a plausible constant when small."""
    if math.prod(shape) >= BIG:
        return torch.empty(shape, dtype=dtype)
    if key.endswith("bias"):
        return torch.zeros(shape, dtype=dtype)
    return torch.full(shape, 0.02 if len(shape) >= 2 else 1.0, dtype=dtype)


def comfy_quant(conf):
    return torch.tensor(list(json.dumps(conf).encode("utf-8")), dtype=torch.uint8)


# --------------------------------------------------------------------------- raylight's Ulysses split

# op -> [calls, bytes this card sends]: all_to_all_single keeps 1/N of its input and sends the rest,
# all_gather_into_tensor sends its whole input to each of the N-1 others
COLLECTIVES = collections.defaultdict(lambda: [0, 0])


def _count_all_to_all(output, input, output_split_sizes=None, input_split_sizes=None, group=None, async_op=False):
    if output_split_sizes is not None or input_split_sizes is not None or async_op:
        raise RuntimeError("uneven or asynchronous all_to_all_single: not what yunchang's Ulysses calls")
    cards = torch.distributed.get_world_size(group)
    COLLECTIVES["all_to_all"][0] += 1
    COLLECTIVES["all_to_all"][1] += device_account.nbytes(input) * (cards - 1) // cards


def _count_all_gather(output, input, group=None, async_op=False):
    if async_op:
        raise RuntimeError("asynchronous all_gather_into_tensor: not what xfuser's all_gather calls")
    COLLECTIVES["all_gather"][0] += 1
    COLLECTIVES["all_gather"][1] += device_account.nbytes(input) * (torch.distributed.get_world_size(group) - 1)


def _unexpected(name):
    def refuse(*args, **kwargs):
        raise RuntimeError("raylight's forward called torch.distributed.%s, which this count does not model" % name)
    return refuse


def rank0_of_ulysses(cards, raylight_src):
    """Rank 0 of ``cards`` as raylight's worker sets it up for Ulysses degree ``cards`` (ring 1, cfg 1),
    with torch's fake process group (no peers) and the collectives counted instead of run: returns the
    ON_LOAD callback raylight's worker adds (``USPInjectRegistry.inject``).

    Left out of raylight's own ``initialize_xfuser_parallel``: ``set_device`` and the real
    ``init_process_group``; every group xfuser and yunchang build is a fake-backend group."""
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    sys.path.insert(0, raylight_src)
    import raylight  # noqa: F401  (raylight's own minimal xfuser: its distributed and attention files)
    from xfuser.core.distributed import parallel_state

    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=cards)
    new_group = dist.new_group
    dist.new_group = lambda ranks=None, **kwargs: new_group(ranks, **dict(kwargs, backend="fake"))
    try:
        parallel_state._WORLD = parallel_state.init_world_group(list(range(cards)), 0, "fake")
        parallel_state.initialize_model_parallel(sequence_parallel_degree=cards, ulysses_degree=cards, ring_degree=1,
                                                 backend="fake")
    finally:
        dist.new_group = new_group
    dist.all_to_all_single = _count_all_to_all
    dist.all_gather_into_tensor = _count_all_gather
    for name in ("all_reduce", "all_gather", "broadcast", "reduce_scatter_tensor", "batch_isend_irecv", "barrier",
                 "send", "recv", "isend", "irecv", "all_to_all"):
        setattr(dist, name, _unexpected(name))
    import raylight.distributed_modules.attention as raylight_attention

    # the attention the shim gives every raylight choice on the NPU: torch's SDPA (TORCH_MATH), run by
    # torch_npu's fused kernel; sync_ulysses as RayInitializer's default
    raylight_attention.set_attn_type("TORCH_MATH")
    raylight_attention.set_sync_ulysses(False)
    from raylight.distributed_modules.usp import USPInjectRegistry

    report["ulysses"] = {"cards": cards, "attention": "TORCH_MATH",
                         "sequence_parallel_world": parallel_state.get_sequence_parallel_world_size()}
    return USPInjectRegistry.inject


# --------------------------------------------------------------------------- the DiT step


def dit_state_dict():
    import comfy.ldm.minimax.model
    import comfy.ops

    with torch.device("meta"):
        model = comfy.ldm.minimax.model.MiniMaxH3Model(dtype=torch.bfloat16, operations=comfy.ops.disable_weight_init)
    sd = {}
    quantized = 0
    for key, t in model.state_dict().items():
        if OPTS.variant == "int8" and key.startswith("blocks.") and key.endswith(".weight") and t.dim() == 2 \
                and (".attn." in key or ".mlp." in key):
            layer = key[: -len(".weight")]
            sd[key] = torch.empty(tuple(t.shape), dtype=torch.int8)
            sd[layer + ".weight_scale"] = torch.tensor(0.01, dtype=torch.float32)
            sd[layer + ".comfy_quant"] = comfy_quant({"format": "int8_tensorwise"})
            quantized += 1
        elif key == "rope.inv_freq":
            n = t.shape[0]
            sd[key] = 1.0 / (10000.0 ** (torch.arange(n, dtype=torch.float32) / n))
        else:
            sd[key] = fill(tuple(t.shape), t.dtype, key)
    report["parameters"] = sum(t.numel() for k, t in model.state_dict().items())
    report["quantized_layers"] = quantized
    return sd


def run_dit():
    import comfy.nested_tensor
    import comfy.sd
    from comfy_extras.nodes_minimax_h3 import _empty_av_latent

    sd = dit_state_dict()
    patcher = comfy.sd.load_diffusion_model_state_dict(sd)
    del sd
    if OPTS.ulysses:  # as raylight's worker: its USP forward injected when the model loads
        import comfy.patcher_extension

        patcher.add_callback(comfy.patcher_extension.CallbacksMP.ON_LOAD, USP_INJECT)
    model = patcher.model
    report["model_class"] = type(model).__name__
    report["unet_config"] = {k: v for k, v in model.model_config.unet_config.items()
                             if isinstance(v, (int, float, str, bool))}
    report["compute_dtype"] = str(model.get_dtype())
    report["layers"] = dict(collections.Counter(
        getattr(m.weight, "_layout_cls", str(m.weight.dtype)) for m in model.diffusion_model.modules()
        if type(m).__name__ == "Linear"))
    latent, frames = _empty_av_latent(OPTS.width, OPTS.height, OPTS.length)
    video, audio = latent["samples"].unbind()
    report["latent"] = {"video": list(video.shape), "audio": list(audio.shape), "frames": frames}
    mm.load_models_gpu([patcher])
    report["weights_on_npu_bytes"] = npu_device.memory_allocated()

    report["weight_placement"] = collections.Counter(
        p.device.type for p in model.diffusion_model.parameters())
    device = mm.get_torch_device()
    shapes = [video.shape, audio.shape]
    context = torch.empty(1, OPTS.text_len, 5120, dtype=torch.bfloat16)
    conds = []
    for which in ("positive", "negative")[:OPTS.cfg]:  # cfg 2: the model runs for both, MiniMax-H3 one at a time
        extra = model.extra_conds(cross_attn=context, latent_shapes=shapes, device=device, seed=0,
                                  noise=video, latent_image=video)
        conds.append({k: v.cond for k, v in extra.items()})
    report["tokens"] = conds[0]["minimax_payload"]["layout"].seq_len
    import comfy.utils

    # the sampler's packed latent (video then audio, flattened), as comfy.sample hands it over
    x, _ = comfy.utils.pack_latents([torch.empty(video.shape, device=device), torch.empty(audio.shape, device=device)])
    sigma = torch.tensor([0.5], device=device)
    with torch.inference_mode():  # as ComfyUI's executor samples (the data-less load runs outside it)
        model.apply_model(x, sigma, **conds[0])  # the first forward: one-time probes and tables stay out
        start_counting()
        forwards = 0
        for cond in conds:
            model.apply_model(x, sigma, **cond)
            forwards += 1
        report["forwards_per_step"] = forwards
        report["step"] = stop_counting()


# --------------------------------------------------------------------------- the VAE decode


def run_vae():
    import comfy.ldm.minimax.vae

    # ComfyUI's VAE() calls .to(vae_dtype) on the CPU model: torch's Module._apply swaps a FakeTensor
    # parameter (torch.utils.swap_tensors, which refuses FakeTensorMode's weak references), so the
    # VAE's large host tensors are meta ones; they become data-less npu tensors when moved
    MODE.meta = True
    with torch.device("meta"):
        vae_model = comfy.ldm.minimax.vae.MiniMaxH3VideoVAE()
    decode_counted(vae_model, lambda t: torch.bfloat16 if t.is_floating_point() else t.dtype, "video")


def run_audio():
    """The same latent's audio stream decoded with ComfyUI's ``VAE`` holding MiniMax-H3's audio VAE (DAC
    encoder, BigVGAN decoder; float32, its working dtype), as the template's audio decode calls it."""
    import comfy.ldm.minimax.audio_vae

    MODE.meta = True  # as the video VAE
    with torch.device("meta"):
        audio_model = comfy.ldm.minimax.audio_vae.MiniMaxH3AudioVAE()
    decode_counted(audio_model, lambda t: t.dtype, "audio")


def decode_counted(model, dtype_of, stream):
    """ComfyUI's ``VAE`` made from ``model``'s state dict (data-less tensors of ``dtype_of(tensor)``)
    decodes the ``stream`` ("video" or "audio") of the user's empty latent; the decode is counted."""
    import comfy.sd
    from comfy_extras.nodes_minimax_h3 import _empty_av_latent

    sd = {k: fill(tuple(t.shape), dtype_of(t), k) for k, t in model.state_dict().items()}
    report["parameters"] = sum(t.numel() for t in model.state_dict().values())
    vae = comfy.sd.VAE(sd=sd)
    report["vae_dtype"] = str(vae.vae_dtype)
    report["vae_class"] = type(vae.first_stage_model).__name__
    latent, frames = _empty_av_latent(OPTS.width, OPTS.height, OPTS.length)
    samples = dict(zip(("video", "audio"), latent["samples"].unbind()))[stream]
    report["latent"] = {stream: list(samples.shape), "frames": frames}
    start_counting()
    # ComfyUI's executor decodes under inference_mode; the data-less load inside decode() fails
    # there, so no_grad: the same kernels (the VAE's parameters ask for gradients, which in grad
    # mode would send every RMSNorm to torch's composite)
    with torch.no_grad():
        decoded = share_counted(vae, samples, OPTS.share) if OPTS.share > 1 and stream == "video" else \
            vae.decode(samples)
    report["output"] = list(decoded.shape)
    report["step"] = stop_counting()


class RankZeroOf:
    """torch.distributed as worker 0 of ``size`` meets it in ``tile_share.decode_shared``: every peer
    agrees (its verdict is worker 0's), and each tile a peer computed arrives (its bytes counted, no data)."""

    ReduceOp = torch.distributed.ReduceOp
    P2POp = collections.namedtuple("P2POp", "op tensor peer")

    def __init__(self, size):
        self.size = size

    def get_rank(self):
        return 0

    def get_world_size(self):
        return self.size

    def all_reduce(self, tensor, op=None):
        COLLECTIVES["all_reduce"][0] += 1

    def irecv(self, tensor, peer):
        raise RuntimeError("tile_share posts its receives through batch_isend_irecv")

    isend = irecv

    def batch_isend_irecv(self, ops):
        for op in ops:
            if op.op != self.irecv:
                raise RuntimeError("worker 0 only receives tiles")
            COLLECTIVES["tiles_received"][0] += 1
            COLLECTIVES["tiles_received"][1] += device_account.nbytes(op.tensor)
        return []


def share_counted(vae, samples, cards):
    """Worker 0's part of raylight's distributed decode of ``samples`` over ``cards`` (counted)."""
    from ascend_shim.distributed import tile_share
    from ascend_shim.patches.raylight import vae_share

    model = vae.first_stage_model
    predict = vae_share._tile_shape(model.decoder)
    z = vae_share.on_the_card(vae, samples)
    calls = []
    compute = model._decode_pixels

    def counted_tile(latent):
        calls.append(list(latent.shape))
        return compute(latent)

    model._decode_pixels = counted_tile
    try:
        frames, _shape, whole = tile_share.decode_shared(lambda: model.decode(z), model, "_decode_pixels", predict,
                                                         RankZeroOf(cards), vae.device)
    finally:
        del model._decode_pixels
    if whole is not None:
        raise RuntimeError("worker 0 decoded it whole: %s" % whole)
    report["tiles"] = {"computed": len(calls), "received": COLLECTIVES["tiles_received"][0]}
    return frames.to(device=vae.output_device, dtype=vae.vae_output_dtype()).movedim(1, -1)


# --------------------------------------------------------------------------- the text encoder


def run_te():
    """MiniMax-H3's text encoder (v0.30.0: ``comfy.text_encoders.minimax``, Qwen3-VL-32B's first 50 layers)
    encodes a ``--text-len``-token prompt on the card, as ``CLIPTextEncode`` calls it: ComfyUI's ``CLIP``
    built from the class the loader picks for that checkpoint (``minimax.te``), weights in bf16, loaded with
    ComfyUI's loader, one uncounted encode, then one counted. Token ids are given (no tokenizer files: a
    text-to-video prompt is text ids alone, no vision block); the values do not change the work."""
    import comfy.sd
    import comfy.supported_models_base
    import comfy.text_encoders.minimax

    MODE.meta = True  # as the VAE: the encoder's large host tensors are meta ones until they reach the card
    target = comfy.supported_models_base.ClipTarget(lambda **kwargs: None, comfy.text_encoders.minimax.te(dtype_llama=torch.bfloat16))
    clip = comfy.sd.CLIP(target, model_options={"initial_device": torch.device("cpu")})
    model = clip.cond_stage_model
    report["parameters"] = sum(p.numel() for p in model.parameters())
    report["model_class"] = type(model).__name__
    report["te_dtype"] = str(next(model.parameters()).dtype)
    ids = [(1000 + i % 100, 1.0) for i in range(OPTS.text_len)]
    tokens = {"qwen3vl_32b": [ids]}
    with torch.inference_mode():
        out = clip.encode_from_tokens(tokens, return_dict=True)  # loads it onto the card; one-time work stays out
        report["weights_on_npu_bytes"] = npu_device.memory_allocated()
        start_counting()
        out = clip.encode_from_tokens(tokens, return_dict=True)
        report["step"] = stop_counting()
    report["tokens"] = OPTS.text_len
    report["output"] = list(out["cond"].shape)


USP_INJECT = rank0_of_ulysses(OPTS.ulysses, OPTS.raylight) if OPTS.ulysses else None
MODE = DataLess()
import comfy.ldm.minimax.model  # noqa: E402  (imported outside the mode)
import comfy.ldm.minimax.vae  # noqa: E402
import comfy.ldm.minimax.audio_vae  # noqa: E402,F401
import comfy.nested_tensor  # noqa: E402
import comfy.sd  # noqa: E402
import comfy.text_encoders.minimax  # noqa: E402,F401
import comfy_extras.nodes_minimax_h3  # noqa: E402,F401

try:
    with MODE:
        {"dit": run_dit, "vae": run_vae, "audio": run_audio, "te": run_te}[OPTS.part]()
    report["stage"] = "done"
except BaseException as exc:  # the report says where it stopped
    import traceback

    report["stage"] = "error"
    report["error"] = "%s: %s" % (type(exc).__name__, str(exc).strip().splitlines()[0] if str(exc).strip() else "")
    if exc.__cause__ is not None:
        report["cause"] = repr(exc.__cause__)
    report["traceback"] = [l for l in traceback.format_exc().splitlines() if l.startswith("  File") and "site-packages/torch" not in l][-14:]
report["seconds"] = round(time.monotonic() - START, 1)
if "ascend_shim.engine.runner" in sys.modules:
    report["shim_status"] = {k: v for k, v in ascend_shim.status().items() if k != "patches"}
report["log"] = log_stream.getvalue().splitlines()[-30:]
print(json.dumps(report, default=str))
