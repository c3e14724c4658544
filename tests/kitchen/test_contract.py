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


# -- what INT8 and W4A8 (and any later family) share ------------------------

def test_each_family_counts_its_own_paths_in_one_shape():
    from ascend_shim.kitchen import backend, w4a8

    assert set(backend.COUNTERS.as_dict()) == {"npu_quant", "fallback", "quant_errors", "to_eager",
                                               "declined"}
    assert set(w4a8.COUNTERS.as_dict()) == {"npu_quant", "float_path", "declined"}
    counters = contract.Counters("served")
    counters.add("served")
    counters.decline("x", "first")
    counters.decline("x", "second")
    assert counters.as_dict() == {"served": 1, "declined": {"x": {"count": 2, "last_reason": "second"}}}
    counters.reset()
    assert counters.as_dict() == {"served": 0, "declined": {}}


def test_w4a8_unknown_options_are_what_int8_calls_unknown_outside_its_signature():
    known = contract.W4A8_KNOWN
    assert {"x", "qdata", "s_rel", "s_channel", "codebook", "group_size"} <= known
    options = {"group_size": 8, "future": 2, "flag": False}
    assert contract.unknown_options(options, known) == ["future"]
    assert contract.unknown_options({"future": 2, "flag": False}) == ["future"]


def _oom(*args, **kwargs):
    # torch's own class; its text need not say "out of memory"
    raise torch.OutOfMemoryError("Tried to allocate 2.00 GiB")


def test_out_of_memory_is_raised_on_by_the_w4a8_path_not_served_slower():
    from ascend_shim.kitchen import w4a8

    ops = type("Ops", (), {"npu_dynamic_quant": staticmethod(_oom)})()
    linear = w4a8.W4A8Linear(ops, None, lambda x, group: x, {None})
    x, weight = torch.ones(2, 16, dtype=torch.bfloat16), torch.ones(4, 16, dtype=torch.int8)
    try:
        linear._int8_linear(x, weight, torch.ones(4), None, torch.bfloat16, 16)
    except torch.OutOfMemoryError:
        pass
    else:
        raise AssertionError("an out-of-memory error was served by the float path")
    assert linear.quant_broken is None  # not taken for a broken op


def test_out_of_memory_is_raised_on_by_the_int_mm_kernel_not_blamed_on_the_device(monkeypatch):
    from ascend_shim.aten import int_mm
    from ascend_shim.npu_math import int8 as int8_math

    monkeypatch.setattr(int8_math, "exact_int_mm", _oom)
    # uint8 self: always the fp32 K-chunk path (exact_int_mm), whatever the cube probe would say
    a, b = torch.ones(2, 8, dtype=torch.uint8), torch.ones(8, 4, dtype=torch.int8)
    try:
        int_mm.REGISTRATION.int_mm(a, b)
    except torch.OutOfMemoryError as exc:
        assert "operands are valid" not in str(exc)
    else:
        raise AssertionError("no error")
