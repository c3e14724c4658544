"""Fake ``comfy.ops`` (shape v0_30).

- ``pick_operations(weight_dtype, compute_dtype, load_device=None,
  disable_fast_fp8=False, fp8_optimizations=False, model_config=None)`` calls
  the fp8, nvfp4 and mxfp8 probes first and unconditionally (so it raises
  "Found no NVIDIA driver" on the driverless CUDA-build + NPU box), then routes
  any ``model_config.quant_config`` to ``mixed_precision_ops`` with
  ``disabled = get_disabled_quant_formats(load_device)``.
- ``mixed_precision_ops(...).Linear`` loads ``weight`` / ``weight_scale`` /
  ``comfy_quant`` the way ComfyUI's loader does and runs INT8 weights as a
  kitchen ``QuantizedTensor`` through ``F.linear`` (path A); a format in
  ``disabled`` (or fp8, which this fake does not run natively) is dequantized.
  v0.30 adds the 4-bit INT8-compute formats: ``asym_w4a8_int8`` (``weight``
  int8 ``[N, K/2]``, ``weight_s_rel`` float8_e4m3fn or uint8 viewed as it,
  ``weight_s_channel`` fp32 ``[N]``, optional ``weight_codebook`` ``[16]``)
  and ``convrot_w4a4`` (``weight`` int8 ``[N, K/2]``, ``weight_scale``).
- ``pick_operations`` disables only nvfp4, mxfp8 and fp8, each by its probe:
  the INT8 formats are never disabled (v0.30), so they reach kitchen.
- ``linear_input_act`` calls ``comfy_kitchen.int8_linear`` directly (path B).
- ``make_int8_linear`` is a test-bed convenience (not an upstream name).
"""
import inspect
import json
import logging

import torch
import comfy.model_management
from comfy.cli_args import args, PerformanceFeature
from . import quant_ops
from .quant_ops import QuantizedTensor, QUANT_ALGOS, TensorWiseINT8Layout, get_layout_class

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
    weight = comfy.model_management.cast_to(s.weight, None, device)
    if weight.dtype != dtype:
        weight = weight.to(dtype=dtype)
        if isinstance(weight, QuantizedTensor):
            weight = weight.dequantize()
    return weight, bias


class CastWeightBiasOp:
    comfy_cast_weights = False
    weight_function = []
    bias_function = []


class disable_weight_init:
    class Linear(torch.nn.Linear, CastWeightBiasOp):
        def reset_parameters(self):
            return None

        def forward_comfy_cast_weights(self, input):
            weight, bias = cast_bias_weight(self, input)
            return torch.nn.functional.linear(input, weight, bias)

        def forward(self, *args, **kwargs):
            run_every_op()
            if self.comfy_cast_weights:
                return self.forward_comfy_cast_weights(*args, **kwargs)
            return super().forward(*args, **kwargs)

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


CUBLAS_IS_AVAILABLE = False


_FOUR_BIT_FORMATS = ("asym_w4a8_int8", "convrot_w4a4")


def _four_bit_params(fmt, layout_cls, conf, state_dict, prefix, device, loaded, compute_dtype, shape):
    """Layout params of a v0.30 4-bit INT8-compute layer, popping its tensors from ``state_dict``."""
    def take(name, required=True):
        key = f"{prefix}{name}"
        value = state_dict.pop(key, None)
        if value is None and required:
            raise ValueError(f"Missing {name} for layer {prefix.rstrip('.')}")
        if value is not None:
            loaded.append(key)
            value = value.to(device=device)
        return value

    if fmt == "convrot_w4a4":
        options = {k: conf[k] for k in ("convrot_groupsize", "quant_group_size", "linear_dtype") if k in conf}
        return layout_cls.Params(scale=take("weight_scale"), orig_dtype=compute_dtype, orig_shape=shape, **options)
    s_rel = take("weight_s_rel")
    if s_rel.dtype == torch.uint8:  # files store the float8 group scales as raw bytes
        s_rel = s_rel.view(torch.float8_e4m3fn)
    return layout_cls.Params(scale=s_rel, s_channel=take("weight_s_channel"), codebook=take("weight_codebook", False),
                             group_size=int(conf.get("group_size", 16)),
                             convrot_groupsize=int(conf.get("convrot_groupsize", 256)),
                             orig_dtype=compute_dtype, orig_shape=shape)


def mixed_precision_ops(quant_config={}, compute_dtype=torch.bfloat16, full_precision_mm=False, disabled=[]):
    class MixedPrecisionOps(manual_cast):
        _quant_config = quant_config
        _compute_dtype = compute_dtype
        _full_precision_mm = full_precision_mm
        _disabled = disabled

        class Linear(torch.nn.Module, CastWeightBiasOp):
            _disabled_formats = disabled

            def __init__(self, in_features, out_features, bias=True, device=None, dtype=None):
                super().__init__()
                self.factory_kwargs = {"device": device, "dtype": MixedPrecisionOps._compute_dtype}
                self.in_features = in_features
                self.out_features = out_features
                if bias:
                    self.bias = torch.nn.Parameter(torch.empty(out_features, **self.factory_kwargs))
                else:
                    self.register_parameter("bias", None)
                self._full_precision_mm = MixedPrecisionOps._full_precision_mm
                self._full_precision_mm_config = False

            def reset_parameters(self):
                return None

            def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict,
                                      missing_keys, unexpected_keys, error_msgs):
                device = self.factory_kwargs["device"]
                weight = state_dict.pop(f"{prefix}weight")
                loaded = [f"{prefix}weight"]
                conf = state_dict.pop(f"{prefix}comfy_quant", None)
                if conf is None:
                    self.weight = torch.nn.Parameter(weight.to(device=device, dtype=MixedPrecisionOps._compute_dtype),
                                                     requires_grad=False)
                else:
                    conf = json.loads(conf.numpy().tobytes())
                    self.quant_format = conf.get("format")
                    self._full_precision_mm_config = conf.get("full_precision_matrix_mult", False)
                    if self._full_precision_mm_config or self.quant_format in self._disabled_formats:
                        self._full_precision_mm = True
                    if self.quant_format not in ("int8_tensorwise", "float8_e4m3fn", "float8_e5m2",
                                                 *_FOUR_BIT_FORMATS):
                        raise ValueError(f"Unsupported quantization format: {self.quant_format}")
                    qconfig = QUANT_ALGOS[self.quant_format]
                    self.layout_type = qconfig["comfy_tensor_layout"]
                    layout_cls = get_layout_class(self.layout_type)
                    if self.quant_format in _FOUR_BIT_FORMATS:
                        params = _four_bit_params(self.quant_format, layout_cls, conf, state_dict, prefix,
                                                  device, loaded, MixedPrecisionOps._compute_dtype,
                                                  (self.out_features, self.in_features))
                    else:
                        scale = state_dict.pop(f"{prefix}weight_scale", None)
                        if scale is None:
                            raise ValueError(f"Missing weight scale for layer {prefix.rstrip('.')}")
                        loaded.append(f"{prefix}weight_scale")
                        extra = {"scale": scale.to(device=device)}
                        if self.quant_format == "int8_tensorwise" and conf.get("convrot", False):
                            extra["convrot"] = True
                            extra["convrot_groupsize"] = int(conf.get("convrot_groupsize", 256))
                        params = layout_cls.Params(**extra, orig_dtype=MixedPrecisionOps._compute_dtype,
                                                   orig_shape=(self.out_features, self.in_features))
                    self.weight = torch.nn.Parameter(
                        QuantizedTensor(weight.to(device=device, dtype=qconfig["storage_t"]), self.layout_type, params),
                        requires_grad=False)
                super()._load_from_state_dict(state_dict, prefix, local_metadata, strict,
                                              missing_keys, unexpected_keys, error_msgs)
                for k in loaded:
                    if k in missing_keys:
                        missing_keys.remove(k)

            def forward(self, input, *args, **kwargs):
                run_every_op()
                weight_only = (getattr(self, "layout_type", None) is not None and not self._full_precision_mm
                               and not QUANT_ALGOS[self.quant_format].get("quantize_input", True))
                if weight_only:
                    # weight stays quantized: F.linear dispatches into kitchen's int8_linear
                    weight, bias = cast_bias_weight(self, input=None, dtype=self.weight.dtype,
                                                    device=input.device, bias_dtype=input.dtype)
                else:
                    weight, bias = cast_bias_weight(self, input)
                    if isinstance(weight, QuantizedTensor):
                        weight = weight.dequantize()
                return torch.nn.functional.linear(input, weight, bias)

    return MixedPrecisionOps


def get_disabled_quant_formats(device=None):
    """v0.30: only the formats with a compute probe; INT8 formats always reach kitchen."""
    disabled = set()
    if not comfy.model_management.supports_nvfp4_compute(device):
        disabled.add("nvfp4")
    if not comfy.model_management.supports_mxfp8_compute(device):
        disabled.add("mxfp8")
    if not comfy.model_management.supports_fp8_compute(device):
        disabled.update(("float8_e4m3fn", "float8_e5m2"))
    return disabled


def pick_operations(weight_dtype, compute_dtype, load_device=None, disable_fast_fp8=False, fp8_optimizations=False, model_config=None):
    fp8_compute = comfy.model_management.supports_fp8_compute(load_device)
    nvfp4_compute = comfy.model_management.supports_nvfp4_compute(load_device)  # noqa: F841
    mxfp8_compute = comfy.model_management.supports_mxfp8_compute(load_device)  # noqa: F841
    if model_config and getattr(model_config, "quant_config", None):
        logging.info("Using mixed precision operations")
        disabled = get_disabled_quant_formats(load_device)
        return mixed_precision_ops(model_config.quant_config, compute_dtype, disabled=disabled)
    if fp8_compute and (fp8_optimizations or PerformanceFeature.Fp8MatrixMultiplication in args.fast) and not disable_fast_fp8:
        return fp8_ops
    if compute_dtype is None or weight_dtype == compute_dtype:
        return disable_weight_init
    return manual_cast


def _eager_input_act(x, input_act, act_weight=None, act_eps=0.0):
    if input_act in (None, "none"):
        return x
    if input_act == "gelu_tanh":
        return torch.nn.functional.gelu(x, approximate="tanh")
    if input_act == "swiglu":
        gate, up = x.chunk(2, dim=-1)
        return torch.nn.functional.silu(gate) * up
    if input_act == "rms_norm":
        y = x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + act_eps)
        return (y * act_weight.float()).to(x.dtype) if act_weight is not None else y.to(x.dtype)
    raise ValueError(f"unknown input_act {input_act!r}")


def _kitchen_input_acts():
    """Activation names the installed kitchen's ``int8_linear`` can fuse."""
    try:
        from comfy_kitchen.backends._activations import INPUT_ACT_TO_CODE
        return set(INPUT_ACT_TO_CODE)
    except ImportError:  # kitchen <= 0.2.22: no input_act at all
        return {None}


def linear_input_act(linear, x, input_act, act_weight=None, act_eps=0.0, residual=None, residual_scale=None):
    """``linear(act(x))`` (+ ``residual + residual_scale * ...``): INT8 layers go
    straight to ``comfy_kitchen.int8_linear`` (path B).  Only the keyword
    arguments the installed kitchen accepts are passed; an activation or
    residual it cannot fuse is applied eagerly around the call instead."""
    weight = linear.weight
    if (not isinstance(weight, QuantizedTensor) or weight._layout_cls != "TensorWiseINT8Layout"
            or getattr(weight._params, "transposed", False) or getattr(linear, "_full_precision_mm", False)):
        out = linear(_eager_input_act(x, input_act, act_weight, act_eps))
        return out if residual is None else torch.addcmul(residual, out, residual_scale)
    weight, bias = cast_bias_weight(linear, input=None, dtype=weight.dtype, device=x.device, bias_dtype=x.dtype)
    qdata, scale = TensorWiseINT8Layout.get_plain_tensors(weight)
    accepted = inspect.signature(quant_ops.ck.int8_linear).parameters
    kw = {"convrot": getattr(weight._params, "convrot", False),
          "convrot_groupsize": getattr(weight._params, "convrot_groupsize", 256)}
    if "input_act" in accepted and input_act in _kitchen_input_acts():
        kw["input_act"] = input_act
        if "input_act_weight" in accepted:
            kw.update(input_act_weight=act_weight, input_act_eps=act_eps)
    else:
        x = _eager_input_act(x, input_act, act_weight, act_eps)
    fuse_residual = residual is not None and "residual" in accepted
    if fuse_residual:
        kw.update(residual=residual, residual_scale=residual_scale)
    out = quant_ops.ck.int8_linear(x, qdata, scale, bias, x.dtype, **kw)
    if residual is not None and not fuse_residual:
        out = torch.addcmul(residual, out, residual_scale)
    return out


def make_int8_linear(weight_int8_nk, weight_scale, bias=None, convrot=False, convrot_groupsize=256,
                     compute_dtype=torch.bfloat16, device=None, disabled=()):
    """Test-bed helper: an INT8 ``Linear`` built exactly as ComfyUI's loader does
    (``mixed_precision_ops`` + a state dict with ``weight`` int8 ``[N,K]``,
    ``weight_scale`` fp32 ``()`` or ``[N,1]`` and a ``comfy_quant`` JSON).
    It never calls ``pick_operations`` (which raises on the unpatched box);
    pass ``disabled={"int8_tensorwise"}`` to get the dequantizing fallback."""
    n, k = weight_int8_nk.shape
    conf = {"format": "int8_tensorwise"}
    if convrot:
        conf.update(convrot=True, convrot_groupsize=int(convrot_groupsize))
    ops = mixed_precision_ops({"mixed_ops": True}, compute_dtype, disabled=set(disabled))
    layer = ops.Linear(k, n, bias=bias is not None, device=device)
    if not isinstance(weight_scale, torch.Tensor):
        weight_scale = torch.tensor(weight_scale, dtype=torch.float32)
    sd = {"weight": weight_int8_nk, "weight_scale": weight_scale,
          "comfy_quant": torch.tensor(list(json.dumps(conf).encode("utf-8")), dtype=torch.uint8)}
    if bias is not None:
        sd["bias"] = bias.to(compute_dtype)
    layer.load_state_dict(sd, strict=True)
    return layer
