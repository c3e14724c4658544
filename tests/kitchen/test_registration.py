"""Backend order per ASCEND_SHIM_INT8 and the entry-point table (pure; the live
registry is tested in test_backend and test_registry_access)."""

import pytest

from ascend_shim.kitchen import registration
from ascend_shim.kitchen.backend import FALLBACK, SHIM
from ascend_shim.kitchen.registration import desired_priority, upstream_ahead

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


@pytest.mark.parametrize("order,upstream_ok,expected", [
    (["ascend", "ascend_shim", "ascend_shim_fallback", "eager"], True, True),   # auto
    (["ascend", "ascend_shim_fallback", "eager"], True, True),                  # upstream
    (["ascend_shim", "ascend_shim_fallback", "ascend", "eager"], True, False),  # shim: never reached
    (["ascend", "eager"], True, True),                                          # shim not installed
    (["ascend", "ascend_shim", "ascend_shim_fallback"], False, False),         # no int8_linear upstream
    (["cuda", "eager"], True, False),
])
def test_upstream_serves_only_ahead_of_the_fallback(order, upstream_ok, expected):
    assert upstream_ahead(order, upstream_ok) is expected


def test_entry_points_are_one_row_per_function_and_backend():
    rows = [(e.function, e.backend) for e in registration.ENTRY_POINTS]
    assert len(rows) == len(set(rows))
    assert {e.backend for e in registration.ENTRY_POINTS} == {SHIM, FALLBACK}
    assert ("int8_linear", SHIM) in rows and ("int8_linear", FALLBACK) in rows
    assert all(callable(e.build) for e in registration.ENTRY_POINTS)
