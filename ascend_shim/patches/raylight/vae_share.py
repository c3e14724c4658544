"""raylight's distributed VAE decode spreads MiniMax-H3's video VAE over the workers' NPUs.

``RayVAEDecodeDistributed`` deals a VAE's spatial tiles out to raylight's workers, but refuses a
VAE that tiles itself ("cannot externally tile this VAE"), and MiniMax-H3's video VAE does: it
cuts the video into 17-frame chunks and each chunk into 256-pixel tiles, then blends their
edges. Each of those tiles is one call of ``_decode_pixels`` on its own slice of the latent: no
state passes between them, so they can run anywhere. On NPU workers in one HCCL world, each
worker computes every n-th tile of ComfyUI's own decode and worker 0 blends them with that
same code (``distributed.tile_share``): the frames of ComfyUI's decode on one card, each card
running its share of the tiles. raylight's ``tile_size``/``overlap`` do not apply, as in
ComfyUI's own decode of this VAE.

Where the tiles cannot be shared (no process group spanning the workers; a ComfyUI whose decode
does what the plan's empty tiles cannot), worker 0 decodes the video whole with ComfyUI's own
decode and says so in one line; a tile that fails on one card stops every worker. Every other
VAE, latent and device keeps raylight's own path, its refusals included.
"""

from ascend_shim.engine import versions
from ascend_shim.engine.patching import Patch, argument
from ascend_shim.patches.shared.guards import process_on_npu_and_attribute
from ascend_shim.patches.shared.wraps import wrap_function
from ascend_shim.startup import output

SHARED_VAE = ("comfy.ldm.minimax.vae", "MiniMaxH3VideoVAE")
TILE_CALL = "_decode_pixels"  # one tile of one temporal chunk, from its latent slice alone


def _is_shared_vae(model):
    return any((cls.__module__, cls.__name__) == SHARED_VAE for cls in type(model).__mro__)


def _tile_shape(decoder):
    """(shape, dtype) of one tile call, from the ViT decoder's patch sizes: [B, C, T*pt, H*p, W*p]."""
    sizes = [getattr(decoder, name, None) for name in ("out_channels", "patch_size_t", "patch_size")]
    if not all(isinstance(size, int) and size > 0 for size in sizes):
        return None
    channels, patch_t, patch = sizes

    def predict(z):
        batch, _, frames, height, width = z.shape
        return (batch, channels, frames * patch_t, height * patch, width * patch), z.dtype

    return predict


def _world(job_rank, job_world_size):
    """torch.distributed, where its default group is exactly raylight's workers in job order."""
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_initialized():
        return None, "the workers share no process group"
    if dist.get_world_size() != job_world_size or dist.get_rank() != job_rank:
        return None, "the workers' process group (rank %d of %d) is not the decode's (worker %d of %d)" % (
            dist.get_rank(), dist.get_world_size(), job_rank, job_world_size)
    return dist, None


def _partial(shape, latent, tiles):
    """A worker's result as raylight's combine reads it: one tile covering the whole video
    (worker 0), none elsewhere; no feathering, so the combine adds it once and divides by one."""
    return [{"output_shape": tuple(shape), "spatial_dims": 3, "pass_index": 0,
             "latent_spatial_shape": (latent.shape[3], latent.shape[4]), "overlap_latent": 0,
             "feather": (0, 0), "tiles": tiles}]


def on_the_card(vae, latent):
    """``latent`` on ``vae``'s card in its dtype, the VAE loaded there as ComfyUI's decode loads it."""
    import comfy.model_management as model_management

    memory = vae.memory_used_decode(latent.shape, vae.vae_dtype)
    model_management.load_models_gpu([vae.patcher], memory_required=memory, force_full_load=vae.disable_offload)
    return latent.to(device=vae.device, dtype=vae.vae_dtype)


def _decode(worker, latent, job_rank, job_world_size, predict):
    import comfy.model_management as model_management
    import torch

    from ascend_shim.distributed import tile_share

    vae = worker.vae_model
    model = vae.first_stage_model
    dist, why = _world(job_rank, job_world_size)
    with model_management.cuda_device_context(vae.device), torch.inference_mode():
        z = on_the_card(vae, latent)
        run = lambda: model.decode(z)  # noqa: E731  (ComfyUI's own decode of this VAE)
        if dist is not None:
            frames, shape, why = tile_share.decode_shared(run, model, TILE_CALL, predict, dist, vae.device)
        else:
            # worker 0 decodes it whole; the others need only its shape, planned on empty tiles (where
            # even that cannot be planned, with no group to ask, they decode it too and keep the shape)
            shape = None if job_rank == 0 else tile_share.planned_shape(run, model, TILE_CALL, predict)
            frames = None
            if shape is None:
                frames = run()
                shape = tuple(frames.shape)
            if job_rank != 0:
                frames = None
        if why is not None and job_rank == 0:
            output.warn("raylight's distributed VAE decode: %s, so worker 0's card decodes the MiniMax-H3 "
                        "video whole (ComfyUI's own decode)" % why)
    if frames is None:
        return _partial(shape, latent, [])
    frames = frames.to(device="cpu", dtype=vae.vae_output_dtype(), copy=True)
    return _partial(shape, latent, [(0, 0, 0, 0, frames)])


def _share_tiles(module, wrapped, instance, args, kwargs):
    worker = argument(args, kwargs, 0, "worker")
    samples = argument(args, kwargs, 1, "samples")
    vae = getattr(worker, "vae_model", None)
    model = getattr(vae, "first_stage_model", None)
    latent = samples.get("samples") if isinstance(samples, dict) else None
    device = getattr(getattr(vae, "device", None), "type", None)
    predict = _tile_shape(getattr(model, "decoder", None)) if _is_shared_vae(model) else None
    if predict is None or device != "npu" or not callable(getattr(model, TILE_CALL, None)) \
            or getattr(latent, "ndim", None) != 5 or getattr(latent, "is_nested", False):
        return wrapped(*args, **kwargs)  # raylight's own path and its own refusals
    job_rank = argument(args, kwargs, 6, "job_rank", 0)
    job_world_size = argument(args, kwargs, 7, "job_world_size", 1)
    if job_world_size < 1 or not 0 <= job_rank < job_world_size:
        return wrapped(*args, **kwargs)  # raylight's own error for a bad rank
    return _decode(worker, latent, job_rank, job_world_size, predict)


def apply(changes, module):
    wrap_function(changes, module, "ray_vae_decode_partial_impl", _share_tiles)


PATCH = Patch(
    name="raylight_vae_share",
    target="raylight.distributed_worker.ray_worker",
    summary="raylight's distributed VAE decode spreads MiniMax-H3's video VAE tiles over the NPUs",
    guard=process_on_npu_and_attribute("ray_vae_decode_partial_impl"),
    apply=apply,
    version=versions.raylight,
)
