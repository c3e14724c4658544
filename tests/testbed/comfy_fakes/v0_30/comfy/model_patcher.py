"""Fake ``comfy.model_patcher`` (shape v0_30): loading to the device and LoRA weight patches.

As ComfyUI 0.30's ``ModelPatcher.patch_weight_to_device``: a patched weight
is brought to the load device in float32 (a ``QuantizedTensor`` is moved and
dequantized there), the LoRA products are added, and the result is stored
back in the weight's own form: cast to its dtype, or requantized into its
layout.  ``add_patches`` takes ``{key: (up, down)}`` low-rank pairs.
"""
import torch

import comfy.model_management
import comfy.utils
from comfy.quant_ops import QuantizedTensor


class ModelPatcher:
    def __init__(self, model, load_device, offload_device):
        self.model = model
        self.load_device = load_device
        self.offload_device = offload_device
        self.patches = {}
        self.device = offload_device

    def clone(self):
        other = ModelPatcher(self.model, self.load_device, self.offload_device)
        other.patches = {k: list(v) for k, v in self.patches.items()}
        return other

    def add_patches(self, patches, strength_patch=1.0):
        names = {name for name, _ in self.model.named_parameters()}
        added = []
        for key, (up, down) in patches.items():
            if key in names:
                self.patches.setdefault(key, []).append((strength_patch, up, down))
                added.append(key)
        return added

    def patch_weight_to_device(self, key):
        weight = comfy.utils.get_attr(self.model, key)
        if isinstance(weight, QuantizedTensor):
            temp = weight.to(self.load_device).dequantize().to(torch.float32)
        else:
            temp = comfy.model_management.cast_to_device(weight, self.load_device, torch.float32, copy=True)
        for strength, up, down in self.patches[key]:
            up = up.to(self.load_device, torch.float32)
            down = down.to(self.load_device, torch.float32)
            temp += strength * (up @ down)
        if isinstance(weight, QuantizedTensor):
            extra = {"is_weight": True, "per_channel": True} if weight._layout_cls == "TensorWiseINT8Layout" \
                and weight._params.scale.dim() > 0 else {}
            out = QuantizedTensor.from_float(temp.to(weight.dtype), weight._layout_cls, **extra)
        else:
            out = temp.to(weight.dtype)
        comfy.utils.set_attr_param(self.model, key, out)

    def patch_model(self):
        for key in self.patches:
            self.patch_weight_to_device(key)
        self.model.to(self.load_device)
        self.device = self.load_device

    def model_unload(self):
        self.model.to(self.offload_device)
        self.device = self.offload_device
        return True
