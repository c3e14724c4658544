"""``TESTBED_QMM_CORRUPT``: each corruption of the fake quant ops is wrong in one way only.

One child booted as an ``ascend-cpu`` machine makes a set of probe calls
clean and under each corruption, and reports which probes changed. Each
corruption must change the probes its defect concerns and leave every other
probe bit-identical, so a selftest failure under it points at one defect.

A second child runs the shim's start-of-process check (``kitchen.capability``,
unmodified) on the clean device and under each corruption: every corruption
must turn off exactly the (output dtype, bias) combinations it falsifies.
"""

import json
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent.parent
REPO = TESTS.parent
sys.path.insert(0, str(TESTS))

from testbed import machine  # noqa: E402

QMM = {"base", "bf16_bias", "fp16_bias", "fp16", "odd_m", "tall", "k_tail", "n_tail", "scalar_scale",
       "x2_contiguous"}
DYN = {"dyn_contiguous", "dyn_strided", "dyn_offset", "dyn_zero_row"}
PER_CHANNEL = QMM - {"scalar_scale"}

# corruption -> the probes it must change (all others must not change)
TOUCHES = {
    "pertoken_dropped": QMM,
    "scale_twice": QMM,
    "x2_strides_ignored": QMM - {"x2_contiguous"},
    "bias_ignored": {"bf16_bias", "fp16_bias"},
    "fp16_zeros": {"fp16", "fp16_bias"},
    "bf16_bias_as_fp16": {"bf16_bias"},
    "fp16_bias_as_bf16": {"fp16_bias"},
    "per_channel_scale_first": PER_CHANNEL,
    "odd_m_tail": {"odd_m"},
    "m_tile": {"tall"},
    "k_tail": {"k_tail"},
    "n_tail": {"n_tail"},
    "dyn_round_toward_zero": QMM | DYN,  # every matmul probe quantizes its activations first
    "dyn_strides_ignored": {"dyn_strided"},
    "dyn_offset_ignored": {"dyn_offset"},
    "zero_row_nan": {"dyn_zero_row"},
}

PROBES = r'''
import json, os, torch, torch_npu
from torch_npu import _ops

g = torch.Generator().manual_seed(0)
npu = lambda t: t.to("npu")

def qmm_probe(m=6, k=32, n=16, out=torch.bfloat16, bias=None, scalar=False, transposed=True):
    x = torch.randn(m, k, generator=g).to(torch.bfloat16)
    w = torch.randint(-127, 128, (n, k), generator=g, dtype=torch.int8)
    scale = torch.rand(1 if scalar else n, generator=g) * 0.01 + 0.001
    b = None if bias is None else (torch.rand(n, generator=g) + 0.5).to(bias)
    def run():
        q, s = torch_npu.npu_dynamic_quant(npu(x))
        x2 = npu(w).t() if transposed else npu(w.t().contiguous())
        return torch_npu.npu_quant_matmul(q, x2, npu(scale), pertoken_scale=s, output_dtype=out,
                                          bias=None if b is None else npu(b)).cpu()
    return run

def dyn_probe(layout):
    wide = torch.randn(5, 48, generator=g).to(torch.bfloat16)
    if layout == "zero_row":
        wide[2] = 0
    def run():
        t = npu(wide)
        x = {"contiguous": t[:, :32].contiguous(), "strided": t[:, :32], "offset": t[1:],
             "zero_row": t}[layout]
        q, s = torch_npu.npu_dynamic_quant(x)
        return torch.cat([q.cpu().float().reshape(-1), s.cpu().reshape(-1)])
    return run

probes = {
    "base": qmm_probe(), "bf16_bias": qmm_probe(bias=torch.bfloat16),
    "fp16_bias": qmm_probe(out=torch.float16, bias=torch.float16), "fp16": qmm_probe(out=torch.float16),
    "odd_m": qmm_probe(m=7), "tall": qmm_probe(m=132), "k_tail": qmm_probe(k=40), "n_tail": qmm_probe(n=20),
    "scalar_scale": qmm_probe(scalar=True), "x2_contiguous": qmm_probe(transposed=False),
    **{"dyn_" + layout: dyn_probe(layout) for layout in ("contiguous", "strided", "offset", "zero_row")},
}
clean = {name: run() for name, run in probes.items()}
changed = {}
for corruption in _ops.CORRUPTIONS:
    os.environ["TESTBED_QMM_CORRUPT"] = corruption
    changed[corruption] = sorted(name for name, run in probes.items()
                                 if not torch.equal(run().nan_to_num(nan=1e9), clean[name].nan_to_num(nan=1e9)))
os.environ["TESTBED_QMM_CORRUPT"] = "bias_ignored,no_such_defect"
try:
    probes["base"]()
    unknown = None
except ValueError as exc:
    unknown = str(exc)
print(json.dumps({"changed": changed, "unknown": unknown}))
'''


@pytest.fixture(scope="module")
def report():
    env = machine.subprocess_env("ascend-cpu")
    env.pop("TESTBED_QMM_CORRUPT", None)
    proc = subprocess.run([sys.executable, "-c", PROBES], env=env, capture_output=True, text=True,
                          timeout=300, cwd=tempfile.gettempdir())
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_every_corruption_is_listed_here(report):
    assert set(report["changed"]) == set(TOUCHES)


@pytest.mark.parametrize("corruption", sorted(TOUCHES))
def test_a_corruption_changes_its_probes_and_nothing_else(report, corruption):
    assert report["changed"][corruption] == sorted(TOUCHES[corruption])


def test_an_unknown_corruption_is_an_error_not_a_clean_op(report):
    assert "no_such_defect" in report["unknown"] and "pertoken_dropped" in report["unknown"]


# the capability check's combinations (output dtype, bias) a corruption falsifies
ALL_COMBINATIONS = {"float16", "float16+bias", "bfloat16", "bfloat16+bias"}
FALSIFIES = {
    **{corruption: ALL_COMBINATIONS for corruption in TOUCHES},
    "bias_ignored": {"float16+bias", "bfloat16+bias"},
    "fp16_zeros": {"float16", "float16+bias"},
    "bf16_bias_as_fp16": {"bfloat16+bias"},
    "fp16_bias_as_bf16": {"float16+bias"},
}

RUNTIME_CHECK = r'''
import json, os, torch, torch_npu
from torch_npu import _ops
from ascend_shim.kitchen import capability

def declined():
    check = capability.Capability(torch_npu)  # a fresh process's check
    npu = torch.device("npu", 0)
    combos = {("%s+bias" if bias else "%s") % str(dtype).replace("torch.", ""): (dtype, bias)
              for dtype, bias in capability.COMBINATIONS}
    return {name: check.verdict(npu, *combo) for name, combo in combos.items()
            if check.verdict(npu, *combo) is not None}

report = {"clean": declined()}
for corruption in _ops.CORRUPTIONS:
    os.environ["TESTBED_QMM_CORRUPT"] = corruption
    report[corruption] = declined()
print(json.dumps(report))
'''


@pytest.fixture(scope="module")
def runtime_check():
    env = machine.subprocess_env("ascend-cpu", pythonpath=[REPO])
    env.pop("TESTBED_QMM_CORRUPT", None)
    proc = subprocess.run([sys.executable, "-c", RUNTIME_CHECK], env=env, capture_output=True, text=True,
                          timeout=300, cwd=tempfile.gettempdir())
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_the_runtime_check_passes_the_clean_device(runtime_check):
    assert runtime_check["clean"] == {}


@pytest.mark.parametrize("corruption", sorted(FALSIFIES))
def test_the_runtime_check_catches_each_corruption(runtime_check, corruption):
    assert set(runtime_check[corruption]) == FALSIFIES[corruption], runtime_check[corruption]
