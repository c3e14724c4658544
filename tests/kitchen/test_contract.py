"""The one ``int8_linear`` signature and its record (no device needed; ``check``
itself runs on NPU tensors in ``int8_cases.py``)."""

import dataclasses
import inspect

import torch

from ascend_shim.kitchen import contract


def test_the_signature_is_kitchens_int8_linear_in_order():
    params = list(inspect.signature(contract.int8_linear_call).parameters)
    assert params[:7] == ["x", "weight", "weight_scale", "bias", "out_dtype", "convrot", "convrot_groupsize"]
    assert params[7:12] == ["input_act", "input_act_weight", "input_act_eps", "residual", "residual_scale"]
    assert params[-1] == "extra"


def test_positional_and_keyword_calls_make_the_same_record():
    x, w, s = torch.ones(2, 4), torch.ones(3, 4, dtype=torch.int8), torch.ones(())
    by_position = contract.int8_linear_call(x, w, s, None, torch.float16, True, 64)
    by_keyword = contract.int8_linear_call(x=x, weight=w, weight_scale=s, out_dtype=torch.float16,
                                           convrot=True, convrot_groupsize=64)
    # field by field, tensors by identity: Python 3.13's dataclass __eq__ compares
    # fields with ==, which a tensor answers elementwise
    fields = [f.name for f in dataclasses.fields(by_position)]
    for name in fields:
        mine, theirs = getattr(by_position, name), getattr(by_keyword, name)
        assert mine is theirs if torch.is_tensor(mine) else mine == theirs, name
    assert by_position.dtype == torch.float16
    assert contract.int8_linear_call(x, w, s).dtype == torch.bfloat16  # eager's default


def test_kwargs_repeat_only_what_differs_from_eagers_defaults():
    x, w, s = torch.ones(2, 4), torch.ones(3, 4, dtype=torch.int8), torch.ones(())
    call = contract.int8_linear_call(x, w, s, None, None, False, 256, input_act=None,
                                     input_act_eps=0.0, future_option=3)
    assert set(call.kwargs()) == {"x", "weight", "weight_scale", "future_option"}
    eps = torch.zeros(1)
    call = contract.int8_linear_call(x, w, s, convrot_groupsize=64, input_act_eps=eps)
    assert call.kwargs()["convrot_groupsize"] == 64 and call.kwargs()["input_act_eps"] is eps


def test_unknown_options_ignore_neutral_values():
    assert contract.unknown_options({"a": None, "b": False, "c": 0, "d": 0.0}) == []
    assert contract.unknown_options({"a": 1, "b": "x", "c": torch.ones(1)}) == ["a", "b", "c"]
    call = contract.int8_linear_call(1, 2, 3, future_option=3, other=None)
    assert call.unknown_options() == ["future_option"]
