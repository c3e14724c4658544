"""The attention account's pieces in one interpreter: the fused-kernel conditions, the exact
float-mask check and its cache, the after-prompt line and status's lines.
(The whole patch on a real ComfyUI: tests/patches/test_attention_account.py.)"""

import pytest

torch = pytest.importorskip("torch")

from ascend_shim.commands.status import sections as reports  # noqa: E402
from ascend_shim.patches.comfyui.reports import attention_account as account  # noqa: E402

NEG_INF = float("-inf")


@pytest.fixture(autouse=True)
def fresh():
    account.reset()
    yield
    account.reset()


def qkv(dtype=torch.bfloat16, heads=4, kv_heads=4, head_dim=64, dims=4):
    shape = (1, 8, head_dim) if dims == 3 else None
    q = torch.zeros(shape or (1, heads, 8, head_dim), dtype=dtype)
    k = torch.zeros(shape or (1, kv_heads, 8, head_dim), dtype=dtype)
    return q, k, k


def padding_mask(dtype=torch.bfloat16):
    mask = torch.zeros(1, 1, 8, 8, dtype=dtype)
    mask[..., 6:] = NEG_INF
    return mask


@pytest.mark.parametrize("args, mask, reason", [
    (dict(), None, None),
    (dict(dtype=torch.float32, head_dim=32), None, None),
    (dict(dtype=torch.float64), None, account.DTYPE),
    (dict(dims=3), None, account.NOT_4D),
    (dict(head_dim=576), None, account.HEAD_DIM),
    (dict(heads=4096, kv_heads=4096), None, account.HEADS),
    (dict(heads=4, kv_heads=3), None, account.GQA),
    (dict(heads=8, kv_heads=2), None, None),
    (dict(dtype=torch.float32, head_dim=30), None, account.FP32_HEAD_DIM),
    (dict(head_dim=30), None, None),  # the divisible-by-4 rule is fp32's only
    (dict(), "bool", None),
    (dict(), "float", account.FLOAT_MASK),
])
def test_each_fused_kernel_condition_is_named(args, mask, reason):
    q, k, v = qkv(**args)
    if mask is not None:
        mask = padding_mask() == 0 if mask == "bool" else padding_mask()
    assert account.unmet(q, k, v, mask) == reason


def test_only_a_zero_and_neg_inf_mask_with_a_zero_per_row_becomes_bool():
    q = qkv()[0]
    mask = padding_mask()
    assert torch.equal(account.exact_bool_mask(mask, q), mask == 0)
    assert account.exact_bool_mask(mask.clamp(min=-torch.finfo(torch.bfloat16).max), q) is None
    dead_row = mask.clone()
    dead_row[..., 2, :] = NEG_INF  # all -inf: NaN in the math path, left to it
    assert account.exact_bool_mask(dead_row, q) is None
    bias = mask.clone()
    bias[..., 0, 0] = -0.5  # a bias, not a mask
    assert account.exact_bool_mask(bias, q) is None
    assert account.exact_bool_mask(mask.float(), q) is None  # SDPA refuses the mix; torch says so


@pytest.mark.parametrize("shape, full", [
    ((2, 4, 8, 8), True), ((2, 1, 8, 8), True), ((1, 1, 8, 8), True), ((8, 8), True),
    ((1, 4, 8, 8), False), ((2, 1, 1, 8), False), ((2, 8, 8), False), ((2, 2, 8, 8), False),
    ((2, 1, 8, 1), False),
])
def test_only_masks_of_the_fused_kernels_shapes_are_converted(shape, full):
    # npu_fusion_attention's atten_mask: BNSS, B1SS, 11SS or SS, here B=2, N=4, S=8
    q, k = (torch.zeros(2, 4, 8, 64) for _ in range(2))
    assert account.full_mask_shape(torch.zeros(shape), q, k) is full


def test_a_yes_is_not_served_after_the_mask_changes_in_place():
    q = qkv()[0]
    mask = padding_mask()
    view = mask.view(1, 8, 8).unsqueeze(1)  # attention_pytorch's unsqueeze: a new view, same base
    assert account.exact_bool_mask(view, q) is not None
    assert account.exact_bool_mask(mask.view(1, 8, 8).unsqueeze(1), q) is not None  # cached by base
    mask[..., 0, 0] = -1.0
    assert account.exact_bool_mask(mask.view(1, 8, 8).unsqueeze(1), q) is None


def test_an_inference_mask_is_checked_again_on_every_call():
    q = qkv()[0]
    with torch.inference_mode():
        mask = padding_mask()  # no version counter
        assert account.exact_bool_mask(mask, q) is not None
        mask[..., 0, 0] = -1.0
        assert account.exact_bool_mask(mask, q) is None


def test_a_freed_mask_leaves_no_verdict():
    q = qkv()[0]
    mask = padding_mask()
    account.exact_bool_mask(mask, q)
    assert len(account._verdicts) == 1
    del mask
    assert account._verdicts == {}


def test_prompt_line_and_status_name_the_unmet_conditions():
    assert account.take_prompt_line() is None
    account._count(account.FUSED, *qkv()[:2], None)
    account._count(account.CONVERTED, *qkv()[:2], padding_mask() == 0)
    for _ in range(3):
        account._count(account.FLOAT_MASK_VALUES, *qkv()[:2], padding_mask())
    line = account.take_prompt_line()
    assert line == ("attention: 2 of 5 SDPA calls on the NPU took torch_npu's fused kernel (1 with a float "
                    "0/-inf mask given as bool); unfused math path: 3 float mask with values other than "
                    "0 and -inf (or a row with no 0)")
    assert account.take_prompt_line() is None  # the next prompt starts from zero
    lines = reports.attention_lines(account.report())
    assert lines[0].startswith("attention: 2 of 5 SDPA calls")
    assert "  first %s: q (1, 4, 8, 64) bfloat16, k (1, 4, 8, 64), mask (1, 1, 8, 8) bfloat16" % (
        account.FLOAT_MASK_VALUES) in lines
    assert reports.attention_lines({"calls": 0}) == []
