"""The patch units, in the order they apply when their modules load.

Each module defines one ``PATCH`` (see ``ascend_shim.engine.patching.Patch``) and
lives in the folder of the code it changes:

- ``torch_npu/``  torch_npu and torch's dispatcher: the NPU kernels for ops torch_npu
  lacks, its allocator setting, its CPU-fallback warnings;
- ``kitchen/``    comfy-kitchen: the INT8 backends and their order;
- ``comfyui/``    ComfyUI: ``device/`` (which card, which probes), ``loading/``
  (checkpoints and models moving to the card), ``fp8/`` (fp8 weights on a card
  without fp8), ``fused/`` (its model code on torch_npu's fused ops), ``reports/``
  (what a prompt did, said in the console and ``status``);
- ``raylight/``   raylight, with the xfuser and yunchang code it runs on its workers;
- ``shared/``     what the groups share: when a patch acts (guards), how it wraps.

A patch's ``name`` (what ``status`` prints and ``ASCEND_SHIM_DISABLE`` takes) is
not its module's path: moving a module never changes it.
"""

from ascend_shim.patches.comfyui.device import (
    bf16_legacy,
    compute_probes,
    default_card,
    device_list,
    import_constants,
    int8_compute,
    is_nvidia,
    memory_summary,
    oom,
    synchronize,
    thread_device,
)
from ascend_shim.patches.comfyui.fp8 import dtypes as fp8_dtypes
from ascend_shim.patches.comfyui.fp8 import layer as fp8_layer
from ascend_shim.patches.comfyui.fp8 import loader_options as fp8_loader_options
from ascend_shim.patches.comfyui.fp8 import state_dict as fp8_state_dict
from ascend_shim.patches.comfyui.fused import minimax_vae as minimax_vae_fused
from ascend_shim.patches.comfyui.loading import mmap, model_moves, vae_dtype
from ascend_shim.patches.comfyui.reports import announce, attention_account, audit, prompt_report, prompt_stages
from ascend_shim.patches.kitchen import int8 as kitchen_int8
from ascend_shim.patches.kitchen import priority as kitchen_priority
from ascend_shim.patches.raylight import attention as raylight_attention
from ascend_shim.patches.raylight import base_cache as raylight_base_cache
from ascend_shim.patches.raylight import cache_sync as raylight_cache_sync
from ascend_shim.patches.raylight import controlnet as raylight_controlnet
from ascend_shim.patches.raylight import nodes as raylight_nodes
from ascend_shim.patches.raylight import ranks as raylight_ranks
from ascend_shim.patches.raylight import minimax_keys as raylight_minimax_keys
from ascend_shim.patches.raylight import ring as yunchang_ring
from ascend_shim.patches.raylight import sequence_padding as raylight_padding
from ascend_shim.patches.raylight import torch_compile as raylight_compile
from ascend_shim.patches.raylight import vae_share as raylight_vae_share
from ascend_shim.patches.raylight import wan_keys as raylight_wan_keys
from ascend_shim.patches.raylight import workers as raylight_workers
from ascend_shim.patches.raylight import xfuser as raylight_xfuser
from ascend_shim.patches.raylight import yunchang as yunchang_sync
from ascend_shim.patches.torch_npu import (
    alloc_conf,
    alloc_conf_withdraw,
    cpu_affinity,
    cpu_fallbacks,
    int_mm,
    rms_norm,
    sampler_ops,
)

PATCHES = [
    alloc_conf.PATCH,
    alloc_conf_withdraw.PATCH,
    cpu_affinity.PATCH,
    int_mm.PATCH,
    sampler_ops.PATCH,
    rms_norm.PATCH,
    kitchen_int8.PATCH,
    kitchen_priority.PATCH,
    is_nvidia.PATCH,
    compute_probes.PATCH,
    int8_compute.PATCH,
    import_constants.PATCH,
    default_card.PATCH,
    device_list.PATCH,
    synchronize.PATCH,
    thread_device.PATCH,
    oom.PATCH,
    attention_account.PATCH,
    memory_summary.PATCH,
    model_moves.PATCH,
    bf16_legacy.PATCH,
    mmap.PATCH,
    fp8_dtypes.PATCH,
    fp8_state_dict.PATCH,
    fp8_layer.PATCH,
    fp8_loader_options.PATCH,
    vae_dtype.PATCH,
    minimax_vae_fused.PATCH,
    cpu_fallbacks.PATCH,
    raylight_xfuser.PATCH,
    raylight_ranks.PATCH,
    raylight_workers.PATCH,
    raylight_controlnet.PATCH,
    raylight_vae_share.PATCH,
    raylight_attention.PATCH,
    raylight_nodes.PATCH,
    raylight_cache_sync.PATCH,
    raylight_compile.PATCH,
    raylight_base_cache.PATCH,
    yunchang_sync.PATCH,
    yunchang_ring.PATCH,
    raylight_padding.PATCH,
    raylight_minimax_keys.PATCH,
    raylight_wan_keys.PATCH,
    prompt_stages.PATCH,
    prompt_report.PATCH,
    audit.PATCH,
    announce.PATCH,
]
