"""Fake ``comfy.utils`` (shape v0_3_11; no ``DISABLE_MMAP`` before v0.3.45).

``load_torch_file(ckpt, safe_load=False, device=None)`` loads ``.safetensors``
/ ``.sft`` with ``safetensors.torch.load_file(ckpt, device=device.type)``: on
the CPU its tensors are views of a file mapping; for another device
safetensors creates them there.  Other files go through ``torch.load``.
"""
import torch
import safetensors.torch


def load_torch_file(ckpt, safe_load=False, device=None):
    if device is None:
        device = torch.device("cpu")
    if ckpt.lower().endswith(".safetensors") or ckpt.lower().endswith(".sft"):
        sd = safetensors.torch.load_file(ckpt, device=device.type)
    else:
        pl_sd = torch.load(ckpt, map_location=device, weights_only=True)
        if "state_dict" in pl_sd:
            sd = pl_sd["state_dict"]
        elif len(pl_sd) == 1 and isinstance(next(iter(pl_sd.values())), dict):
            sd = next(iter(pl_sd.values()))
        else:
            sd = pl_sd
    return sd


def save_torch_file(sd, ckpt, metadata=None):
    safetensors.torch.save_file(sd, ckpt, metadata=metadata)


def calculate_parameters(sd, prefix=""):
    return sum(v.nelement() for k, v in sd.items() if k.startswith(prefix))
