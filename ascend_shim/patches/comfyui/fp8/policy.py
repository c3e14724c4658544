"""What fp8 weights become on this NPU: ``ASCEND_SHIM_FP8`` and the SoC's float8 support.

torch_npu holds float8 tensors only on Ascend 950 (Atlas A5). On Atlas A2
(910B) and A3 (910_93) every float8 dtype fails at the first op with
"Float8_e4m3fn has not been supported" (torch_npu's ConvertToAclDataType),
and they have no fp8 matmul. ``auto`` therefore decodes on every SoC but the
950; the default decoded form on those is bf16, which is exact (README,
"FP8 checkpoints").
"""

from ascend_shim.startup import config as _config

FLOAT8_SOCS = ("Ascend950",)
DEFAULT_FORM = "bf16"


def holds_float8(soc_name) -> bool:
    return bool(soc_name) and str(soc_name).startswith(FLOAT8_SOCS)


def decoded_form(setting, soc_name):
    """'bf16' or 'int8' when fp8 weights must be decoded, None to leave them as ComfyUI has them."""
    if setting == "off":
        return None
    if setting == "auto":
        return None if holds_float8(soc_name) else DEFAULT_FORM
    return setting


def soc_name():
    """The current NPU's SoC name, or None when torch_npu cannot say."""
    try:
        import torch

        return torch.npu.get_device_name(torch.npu.current_device())  # type: ignore[attr-defined]
    except Exception:
        return None


def current():
    """(form, why): the decoded form for this process, and the reason when None."""
    setting = _config.get().fp8
    name = soc_name()
    form = decoded_form(setting, name)
    if form is not None:
        return form, None
    if setting == "off":
        return None, "ASCEND_SHIM_FP8=off"
    return None, "this NPU (%s) holds float8" % name


def guard(mm):
    """Patch guard: None when fp8 weights must be decoded for ComfyUI's NPU."""
    from ascend_shim.patches.shared.guards import why_npu_not_chosen

    return why_npu_not_chosen(mm) or current()[1]
