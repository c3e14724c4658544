"""Backend order per ASCEND_SHIM_INT8 (pure function; the live registry is tested in test_backend)."""

import pytest

from ascend_shim.kitchen.registration import desired_priority

OLD = ["cuda", "triton", "eager"]
NEW = ["ascend", "cuda", "triton", "eager"]


@pytest.mark.parametrize("current,policy,upstream_ok,expected", [
    (OLD, "auto", False, ["ascend_shim", "ascend_shim_fallback", "cuda", "triton", "eager"]),
    (NEW, "auto", True, ["ascend", "ascend_shim", "ascend_shim_fallback", "cuda", "triton", "eager"]),
    (NEW, "auto", False, ["ascend_shim", "ascend_shim_fallback", "ascend", "cuda", "triton", "eager"]),
    (NEW, "shim", True, ["ascend_shim", "ascend_shim_fallback", "ascend", "cuda", "triton", "eager"]),
    (NEW, "upstream", True, ["ascend", "ascend_shim_fallback", "cuda", "triton", "eager"]),
    (OLD, "upstream", False, ["ascend_shim_fallback", "cuda", "triton", "eager"]),
])
def test_desired_priority(current, policy, upstream_ok, expected):
    assert desired_priority(current, policy, upstream_ok) == expected


def test_reasserting_is_idempotent_and_keeps_foreign_backends():
    current = ["mine", "ascend", "cuda", "eager"]
    once = desired_priority(current, "auto", True)
    assert once == ["ascend", "ascend_shim", "ascend_shim_fallback", "mine", "cuda", "eager"]
    assert desired_priority(once, "auto", True) == once
