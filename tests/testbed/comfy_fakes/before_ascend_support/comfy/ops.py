"""Fake ``comfy.ops`` (before_ascend_support): ``pick_operations`` with the
v0.2.4 - v0.3.67 signature, probing ``supports_fp8_compute`` first."""
import torch
import comfy.model_management
from comfy.cli_args import args


class disable_weight_init:
    class Linear(torch.nn.Linear):
        comfy_cast_weights = False

        def reset_parameters(self):
            return None


class manual_cast(disable_weight_init):
    class Linear(disable_weight_init.Linear):
        comfy_cast_weights = True


class fp8_ops(manual_cast):
    pass


def scaled_fp8_ops(fp8_matrix_mult=False, scale_input=False, override_dtype=None):
    class scaled_fp8_op(manual_cast):
        pass
    return scaled_fp8_op


def pick_operations(weight_dtype, compute_dtype, load_device=None, disable_fast_fp8=False, fp8_optimizations=False, scaled_fp8=None):
    fp8_compute = comfy.model_management.supports_fp8_compute(load_device)
    if scaled_fp8 is not None:
        return scaled_fp8_ops(fp8_matrix_mult=fp8_compute and fp8_optimizations, scale_input=fp8_optimizations,
                              override_dtype=scaled_fp8)
    if fp8_compute and (fp8_optimizations or args.fast) and not disable_fast_fp8:
        return fp8_ops
    if compute_dtype is None or weight_dtype == compute_dtype:
        return disable_weight_init
    return manual_cast
