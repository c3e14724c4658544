"""ascend_shim.npu_math.fp8_convert: a ComfyUI state dict left without float8, or untouched on bad input."""

import json

import pytest

torch = pytest.importorskip("torch")

from ascend_shim.npu_math import fp8_convert  # noqa: E402
from ascend_shim.npu_math.fp8 import Fp8DecodeError  # noqa: E402


def conf_tensor(conf):
    return torch.tensor(list(json.dumps(conf).encode()), dtype=torch.uint8)


def read_conf(tensor):
    return json.loads(bytes(tensor.tolist()).decode())


def fp8_layer(sd, layer, rows=6, cols=8, fmt="float8_e4m3fn", seed=0, input_scale=True, **conf):
    dtype = getattr(torch, fmt)
    weight = torch.randn(rows, cols, generator=torch.Generator().manual_seed(seed))
    scale = (weight.abs().max() / 200.0).to(torch.float32)
    sd[layer + ".weight"] = (weight / scale).to(dtype)
    sd[layer + ".weight_scale"] = scale
    if input_scale:
        sd[layer + ".input_scale"] = torch.tensor(0.5)
    sd[layer + ".bias"] = torch.zeros(rows, dtype=torch.bfloat16)
    sd[layer + ".comfy_quant"] = conf_tensor(dict(format=fmt, **conf))
    return sd[layer + ".weight"].to(torch.float32) * scale


def snapshot(sd):
    return {k: (v, v.dtype, v.clone()) for k, v in sd.items()}


def bits(tensor):
    return tensor.view(torch.uint8) if tensor.element_size() == 1 else tensor


def assert_untouched(sd, before):
    assert sd.keys() == before.keys()
    for key, (tensor, dtype, copy) in before.items():
        assert sd[key] is tensor and tensor.dtype == dtype and torch.equal(bits(tensor), bits(copy))


def no_float8(sd):
    return [k for k, v in sd.items() if v.dtype.is_floating_point and v.element_size() == 1]


def test_bf16_form_makes_fp8_layers_plain():
    sd = {}
    ref_a = fp8_layer(sd, "blocks.0.attn", fmt="float8_e4m3fn")
    ref_b = fp8_layer(sd, "blocks.0.mlp", fmt="float8_e5m2", seed=1, full_precision_matrix_mult=True)
    counts = fp8_convert.convert(sd, "", "bf16")
    assert counts == {"bf16": 2} and no_float8(sd) == []
    assert sorted(sd) == ["blocks.0.attn.bias", "blocks.0.attn.weight", "blocks.0.mlp.bias", "blocks.0.mlp.weight"]
    assert sd["blocks.0.attn.weight"].dtype == torch.bfloat16
    assert torch.allclose(sd["blocks.0.attn.weight"].float(), ref_a, rtol=2 ** -8, atol=0)
    assert torch.allclose(sd["blocks.0.mlp.weight"].float(), ref_b, rtol=2 ** -8, atol=0)


def test_int8_form_makes_int8_tensorwise_layers():
    sd = {}
    ref = fp8_layer(sd, "proj", full_precision_matrix_mult=True)
    assert fp8_convert.convert(sd, "", "int8") == {"int8": 1}
    assert sd["proj.weight"].dtype == torch.int8 and sd["proj.weight_scale"].shape == (6, 1)
    assert read_conf(sd["proj.comfy_quant"]) == {"format": "int8_tensorwise", "full_precision_matrix_mult": True}
    assert "proj.input_scale" not in sd  # activations are quantized per row by the INT8 path
    dequantized = sd["proj.weight"].float() * sd["proj.weight_scale"]
    assert torch.allclose(dequantized, ref, atol=float(ref.abs().max()) / 127)


def test_w4a8_group_scales_become_float32_and_codes_stay():
    sd = {"blocks.1.ff.weight": torch.randint(-128, 127, (4, 8), dtype=torch.int8),
          "blocks.1.ff.weight_s_rel": (torch.rand(4, 1) + 0.5).to(torch.float8_e4m3fn).view(torch.uint8),
          "blocks.1.ff.weight_s_channel": torch.rand(4),
          "blocks.1.ff.comfy_quant": conf_tensor({"format": "asym_w4a8_int8", "group_size": 16})}
    codes = sd["blocks.1.ff.weight"]
    expected = sd["blocks.1.ff.weight_s_rel"].view(torch.float8_e4m3fn).float()
    assert fp8_convert.convert(sd, "", "bf16") == {"scales": 1}
    assert sd["blocks.1.ff.weight"] is codes
    decoded = sd["blocks.1.ff.weight_s_rel"]
    assert decoded.dtype == torch.float32 and torch.equal(decoded, expected)


def test_plain_fp8_tensors_decode_exactly_and_other_prefixes_wait():
    sd = {"model.diffusion_model.norm": torch.randn(5).to(torch.float8_e5m2),
          "text_encoders.t5.block.weight": torch.randn(3, 3).to(torch.float8_e4m3fn)}
    other = sd["text_encoders.t5.block.weight"]
    exact = sd["model.diffusion_model.norm"].float()
    assert fp8_convert.convert(sd, "model.diffusion_model.", "int8") == {"bf16": 1}
    assert torch.equal(sd["model.diffusion_model.norm"].float(), exact)
    assert sd["text_encoders.t5.block.weight"] is other


def test_legacy_scaled_weights_are_left_for_convert_old_quants():
    sd = {"te.scaled_fp8": torch.empty(0, dtype=torch.float8_e4m3fn),
          "te.a.weight": torch.randn(2, 2).to(torch.float8_e4m3fn), "te.a.scale_weight": torch.tensor([0.5])}
    before = snapshot(sd)
    assert fp8_convert.convert(sd, "", "bf16") == {}
    assert_untouched(sd, before)


def test_a_layer_loading_its_own_state_dict():
    sd = {}
    ref = fp8_layer(sd, "x")
    own = {k[len("x."):]: v for k, v in sd.items()}
    fp8_convert.convert(own, "", "bf16")
    assert sorted(own) == ["bias", "weight"] and torch.allclose(own["weight"].float(), ref, rtol=2 ** -8, atol=0)


def bad_missing_scale(sd):
    del sd["blocks.2.weight_scale"]
    return r"blocks\.2: format float8_e4m3fn \(torch\.float8_e4m3fn\) without weight_scale"


def bad_scale_shape(sd):
    sd["blocks.2.weight_scale"] = torch.ones(5)
    return r"blocks\.2 weight_scale: a scale of shape \(5,\) fits neither"


def bad_json(sd):
    sd["blocks.2.comfy_quant"] = torch.tensor(list(b"{not json"), dtype=torch.uint8)
    return r"blocks\.2: its comfy_quant entry is not JSON"


def bad_format(sd):
    sd["blocks.2.comfy_quant"] = conf_tensor({"format": "nvfp4"})
    return r"blocks\.2: format 'nvfp4' keeps torch\.float8_e4m3fn in weight"


@pytest.mark.parametrize("spoil", [bad_missing_scale, bad_scale_shape, bad_json, bad_format])
def test_bad_input_names_the_layer_and_leaves_the_dict_untouched(spoil):
    sd = {}
    fp8_layer(sd, "blocks.1")  # a good layer first: it must not be converted either
    fp8_layer(sd, "blocks.2", seed=2)
    sd["norm"] = torch.randn(6).to(torch.float8_e4m3fn)
    message = spoil(sd)
    before = snapshot(sd)
    for form in ("bf16", "int8"):
        with pytest.raises(Fp8DecodeError, match=message):
            fp8_convert.convert(sd, "", form)
        assert_untouched(sd, before)


def test_an_unknown_8bit_float_is_refused_with_its_key(monkeypatch):
    from ascend_shim.npu_math import fp8 as fp8_math

    monkeypatch.setattr(fp8_math, "FLOAT8_NAMES", ("float8_e4m3fn",))
    sd = {"blocks.0.weight": torch.ones(2, 2).to(torch.float8_e4m3fn),
          "blocks.0.gate": torch.ones(2).to(torch.float8_e5m2)}
    before = snapshot(sd)
    with pytest.raises(Fp8DecodeError, match=r"blocks\.0\.gate: torch\.float8_e5m2 is an 8-bit float"):
        fp8_convert.convert(sd)
    assert_untouched(sd, before)
