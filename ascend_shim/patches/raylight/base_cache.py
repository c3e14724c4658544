"""raylight's cached base model on an NPU: a LoRA switch reads the model from its file again, as on CUDA.

A raylight worker (non-FSDP) keeps the model it loaded as its cached base; a later
``RayUNETLoader`` of the same file with another LoRA clones that base and patches the clone.
Where the base's weights are on the card, ComfyUI's patching then keeps each original weight
beside its patched copy while the card holds both: raylight's comment in ``load_unet`` measures
~15 to ~23 GB per GPU. raylight avoids it for weights on CUDA only (``device.type == "cuda"``):
it frees the cached base's card memory and reloads the file (mmap, no host copy). Weights on an
NPU miss that test and take the clone. Here, on an NPU worker, the same step runs first for
NPU weights, so raylight's ``load_unet`` finds no cached base and reloads, as it does on CUDA.

Acts only where raylight's own branch would (not FSDP, not the model already active for this
request, a cached base of the same file and options) and the cached weights are on an NPU;
every other call is raylight's as it is. A raylight without these methods keeps its own path.
"""

from ascend_shim.engine import versions
from ascend_shim.engine.patching import Patch, argument
from ascend_shim.patches.shared.guards import process_on_npu_and_attribute
from ascend_shim.patches.shared.wraps import wrap_function

# what the pre-step calls of raylight's worker: its keys and its cache invalidation
WORKER_METHODS = ("_base_model_key", "_active_model_key", "_invalidate_non_fsdp_cache")


def cached_base_on_npu(worker, unet_path, model_options) -> bool:
    """Whether raylight's ``load_unet`` would reuse ``worker``'s cached base, and its weights are on an NPU."""
    if worker.parallel_dict.get("is_fsdp") is True or worker.cached_base_model is None:
        return False
    if worker.model is not None and worker.active_request_key == worker._active_model_key(unet_path, model_options):
        return False  # raylight's fast path: the model is already the active one, nothing is patched again
    if worker.cached_base_key != worker._base_model_key(unet_path, model_options):
        return False
    base = getattr(worker.cached_base_model, "model", worker.cached_base_model)
    first = next(base.parameters(), None)
    return first is not None and first.device.type == "npu"


def _reload_like_cuda(module, wrapped, instance, args, kwargs):
    try:
        unet_path = argument(args, kwargs, 0, "unet_path")
        model_options = argument(args, kwargs, 1, "model_options")
        from raylight.comfy_dist.model_patcher import free_model_vram

        reload = cached_base_on_npu(instance, unet_path, model_options)
    except Exception:  # a raylight that differs from the one read: its own path
        reload = False
    if reload:  # raylight's own step for a cached base on CUDA, then its load_unet reads the file
        free_model_vram(instance.cached_base_model)
        instance._invalidate_non_fsdp_cache()
    return wrapped(*args, **kwargs)


def guard(module):
    reason = process_on_npu_and_attribute("RayWorker")(module)
    if reason:
        return reason
    missing = [name for name in ("load_unet",) + WORKER_METHODS if not hasattr(module.RayWorker, name)]
    if missing:
        return "this raylight's RayWorker has no %s" % ", ".join(missing)
    return None


def apply(changes, module):
    wrap_function(changes, module, "load_unet", _reload_like_cuda, owner=module.RayWorker)


PATCH = Patch(
    name="raylight_base_cache",
    target="raylight.distributed_worker.ray_worker",
    summary="raylight's cached base model: a LoRA switch on an NPU reloads the model file, as raylight "
            "does for CUDA weights, instead of patching a clone of the weights on the card",
    guard=guard,
    apply=apply,
    version=versions.raylight,
)
