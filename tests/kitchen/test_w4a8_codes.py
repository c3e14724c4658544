"""The W4A8 storage decode (ascend_shim/npu_math/w4a8_codes.py) and the W4A8 call checks, on CPU tensors.

The decode is compared bit for bit with kitchen's own eager decode of the
real 0.2.27 and 0.2.40 wheels, in a child interpreter per release.
"""

import json
import sys

import pytest
import torch

import harness
from ascend_shim.kitchen import contract, w4a8
from ascend_shim.npu_math import int8 as int8_math
from ascend_shim.npu_math import w4a8_codes

KITCHENS = tuple(v for v in ("0.2.27", "0.2.40") if v in harness.KITCHEN_VERSIONS)

AGAINST_EAGER = """
import json, torch
import comfy_kitchen as ck
from comfy_kitchen.backends.eager import w4a8_int8 as eager
from ascend_shim.npu_math import w4a8_codes
torch.manual_seed(0)
results = []
for n, k, group, codebook in ((64, 256, 16, True), (32, 512, 16, False), (48, 256, 32, True), (16, 256, 8, True)):
    qdata, s_rel, _s_channel, _c, book = ck.quantize_w4a8_int8_weight(
        torch.randn(n, k) * 0.02, group_size=group, codebook=codebook)
    want = eager._dequant_int4_grouped_to_int8(qdata, s_rel, book, group)
    got = w4a8_codes.decode_int4_to_int8(qdata, s_rel, book, group)
    results.append({"case": [n, k, group, codebook], "equal": bool(torch.equal(got, want)),
                    "codebook": book is not None, "dtype": str(got.dtype)})
print(json.dumps(results))
"""


@pytest.mark.parametrize("version", KITCHENS)
def test_decode_matches_kitchens_eager_bit_for_bit(version, tmp_path):
    env = harness.bed_env(machine=None, kitchen=version, extra_path=[str(harness.REPO)], ASCEND_SHIM="0")
    proc = harness.run([sys.executable, "-c", AGAINST_EAGER], env, tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads(proc.stdout.strip().splitlines()[-1])
    assert [r["codebook"] for r in results] == [True, False, True, True]
    for r in results:
        assert r["equal"] and r["dtype"] == "torch.int8", r


def test_unpack_reads_the_low_nibble_first():
    packed = torch.tensor([[0x21, -0x6C]], dtype=torch.int8)  # bytes 0x21, 0x94
    assert w4a8_codes.unpack_int4_codes(packed, 4).tolist() == [[1, 2, 4, 9]]


def test_uniform_levels_are_centred_on_code_eight():
    codes = torch.arange(16, dtype=torch.int32).reshape(1, 16)
    assert w4a8_codes.code_levels(codes, None).tolist() == [list(range(-8, 8))]


def test_decode_rounds_half_to_even_and_clamps():
    qdata = torch.tensor([[0x10, 0x32]], dtype=torch.int8)  # codes 0, 1, 2, 3
    book = torch.tensor([0.5, 1.5, -1000.0, 1000.0] + [0.0] * 12)
    s_rel = torch.ones(1, 1)
    assert w4a8_codes.decode_int4_to_int8(qdata, s_rel, book, 4).tolist() == [[0, 2, -127, 127]]


def test_geometry_tells_four_from_six_bits():
    s_rel = torch.ones(8, 4)
    assert w4a8_codes.packed_geometry(torch.zeros(8, 32, dtype=torch.int8), s_rel, 16) == (8, 64, 4)
    assert w4a8_codes.packed_geometry(torch.zeros(8, 48, dtype=torch.int8), s_rel, 16) == (8, 64, 6)
    assert w4a8_codes.packed_geometry(torch.zeros(8, 33, dtype=torch.int8), s_rel, 16)[2] == 0


# -- the checks the call rule runs (CPU tensors stand in for their geometry) --

def weight(n=32, k=256, group=16):
    return {"qdata": torch.zeros(n, k // 2, dtype=torch.int8), "s_rel": torch.ones(n, k // group),
            "s_channel": torch.ones(n), "codebook": torch.zeros(16)}


def test_weight_check_accepts_the_storage_contract():
    assert w4a8.check_weight(dict(weight()), 256) is None


@pytest.mark.parametrize("change, param", [
    ({"qdata": torch.zeros(32, 192, dtype=torch.int8)}, "qdata"),       # 6-bit rows
    ({"qdata": torch.zeros(32, 128, dtype=torch.int16)}, "qdata"),
    ({"s_rel": torch.ones(32, 8)}, "qdata"),                            # K from the scale grid
    ({"s_channel": torch.ones(31)}, "s_channel"),
    ({"codebook": torch.zeros(8)}, "codebook"),
    ({"group_size": 12}, "group_size"),
    ({"convrot_groupsize": 32}, "convrot_groupsize"),
    ({"bias": torch.zeros(31)}, "bias"),
])
def test_weight_check_declines_what_the_npu_path_cannot_take(change, param):
    kw = dict(weight(), **change)
    assert w4a8.check_weight(kw, 256)[0] == param


def test_weight_check_declines_a_k_mismatch():
    assert w4a8.check_weight(dict(weight()), 512)[0] == "x"


def test_weight_check_declines_dimensions_over_the_op_limit():
    n = int8_math.MAX_QUANT_MATMUL_DIM + 1
    assert w4a8.check_weight(dict(weight(n=n, k=256)), 256)[0] == "qdata"


def test_unknown_options_only_when_they_mean_something():
    known = contract.W4A8_KNOWN
    assert contract.unknown_options({"x": 1, "future": None, "flag": False, "level": 0}, known) == []
    assert contract.unknown_options({"future": 2, "mode": "fast", "group_size": 8}, known) == [
        "future", "mode"]


def test_call_check_declines_cpu_tensors_and_correction():
    kw = dict(weight(), x=torch.zeros(4, 256, dtype=torch.bfloat16))
    assert w4a8.check_packed_call(kw, {None})[0] == "x"  # not an NPU tensor
