"""Fake ``comfy.ops`` (shape v0_3_11, before comfy-kitchen).

``pick_operations(weight_dtype, compute_dtype, load_device=None,
disable_fast_fp8=False, fp8_optimizations=False, scaled_fp8=None)`` (the
v0.2.4 - v0.3.67 signature; of this era, a plain
``--fast`` switch) probes ``supports_fp8_compute(load_device)`` first
and unconditionally, so it raises "Found no NVIDIA driver" on the driverless
CUDA-build + NPU box.  No quantized ops, no comfy.quant_ops.
"""
import torch
import comfy.model_management
from comfy.cli_args import args

cast_to = comfy.model_management.cast_to


def run_every_op():
    comfy.model_management.throw_exception_if_processing_interrupted()


def cast_bias_weight(s, input=None, dtype=None, device=None, bias_dtype=None):
    if input is not None:
        if dtype is None:
            dtype = input.dtype
        if bias_dtype is None:
            bias_dtype = dtype
        if device is None:
            device = input.device
    bias = None
    if s.bias is not None:
        bias = comfy.model_management.cast_to(s.bias, bias_dtype, device)
    weight = comfy.model_management.cast_to(s.weight, dtype, device)
    return weight, bias


class CastWeightBiasOp:
    comfy_cast_weights = False
    weight_function = []
    bias_function = []


class disable_weight_init:
    class Linear(torch.nn.Linear, CastWeightBiasOp):
        def reset_parameters(self):
            return None

        def forward(self, input):
            run_every_op()
            if self.comfy_cast_weights:
                weight, bias = cast_bias_weight(self, input)
                return torch.nn.functional.linear(input, weight, bias)
            return super().forward(input)

    class Conv2d(torch.nn.Conv2d, CastWeightBiasOp):
        def reset_parameters(self):
            return None

        def forward(self, input):
            run_every_op()
            if self.comfy_cast_weights:
                weight, bias = cast_bias_weight(self, input)
                return self._conv_forward(input, weight, bias)
            return super().forward(input)


class manual_cast(disable_weight_init):
    class Linear(disable_weight_init.Linear):
        comfy_cast_weights = True

    class Conv2d(disable_weight_init.Conv2d):
        comfy_cast_weights = True


class fp8_ops(manual_cast):
    pass


def scaled_fp8_ops(fp8_matrix_mult=False, scale_input=False, override_dtype=None):
    class scaled_fp8_op(manual_cast):
        pass
    scaled_fp8_op.fp8_matrix_mult = fp8_matrix_mult
    scaled_fp8_op.scale_input = scale_input
    scaled_fp8_op.override_dtype = override_dtype
    return scaled_fp8_op


CUBLAS_IS_AVAILABLE = False


def pick_operations(weight_dtype, compute_dtype, load_device=None, disable_fast_fp8=False, fp8_optimizations=False, scaled_fp8=None):
    fp8_compute = comfy.model_management.supports_fp8_compute(load_device)
    if scaled_fp8 is not None:
        return scaled_fp8_ops(fp8_matrix_mult=fp8_compute, scale_input=True, override_dtype=scaled_fp8)
    if fp8_compute and (fp8_optimizations or args.fast) and not disable_fast_fp8:
        return fp8_ops
    if compute_dtype is None or weight_dtype == compute_dtype:
        return disable_weight_init
    return manual_cast
