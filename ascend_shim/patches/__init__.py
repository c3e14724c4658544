"""The patch units, in the order they apply when their modules load.

Each module defines one ``PATCH``; see ``ascend_shim.engine.patching.Patch``.
"""

from ascend_shim.patches import (
    alloc_conf,
    alloc_conf_withdraw,
    announce,
    attention_account,
    bf16_legacy,
    compute_probes,
    cpu_fallbacks,
    device_list,
    fp8_dtypes,
    fp8_layer,
    fp8_loader_options,
    fp8_state_dict,
    import_constants,
    int8_compute,
    int_mm,
    is_nvidia,
    kitchen_int8,
    kitchen_priority,
    memory_summary,
    mmap,
    prompt_report,
    synchronize,
)

PATCHES = [
    alloc_conf.PATCH,
    alloc_conf_withdraw.PATCH,
    int_mm.PATCH,
    kitchen_int8.PATCH,
    kitchen_priority.PATCH,
    is_nvidia.PATCH,
    compute_probes.PATCH,
    int8_compute.PATCH,
    import_constants.PATCH,
    device_list.PATCH,
    synchronize.PATCH,
    attention_account.PATCH,
    memory_summary.PATCH,
    bf16_legacy.PATCH,
    mmap.PATCH,
    fp8_dtypes.PATCH,
    fp8_state_dict.PATCH,
    fp8_layer.PATCH,
    fp8_loader_options.PATCH,
    cpu_fallbacks.PATCH,
    prompt_report.PATCH,
    announce.PATCH,
]
