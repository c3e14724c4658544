"""The simulated SoCs' float8 support (npu_device float8 refusal, fake torch_npu per SoC).

torch_npu on Atlas A2/A3 fails on a float8 tensor with "Float8_e4m3fn has not
been supported"; the bed's 910B refuses every way a float8 npu tensor can
come to be (created, copied from the host, produced by an op), while an
``Ascend950*`` SoC (TESTBED_NPU_NAME) holds them. Each machine runs in a child.
"""

import json
import subprocess
import sys

import pytest

from testbed import machine

pytest.importorskip("torch")

PROBE = r"""
import json, torch, torch_npu
host = torch.randn(4, 4)
ways = {
    "create": lambda: torch.empty(2, dtype=torch.float8_e4m3fn, device="npu"),
    "copy": lambda: host.to(torch.float8_e5m2).to("npu"),
    "produce": lambda: host.to("npu").to(torch.float8_e4m3fn),
    "factory_like": lambda: torch.zeros_like(host.to("npu"), dtype=torch.float8_e4m3fn),
    "bf16": lambda: host.to(torch.bfloat16).to("npu"),
}
out = {"name": torch.npu.get_device_name(0)}
for name, make in ways.items():
    try:
        t = make()
        out[name] = "ok: %s on %s" % (str(t.dtype).replace("torch.", ""), t.device)
    except Exception as exc:
        out[name] = "%s: %s" % (type(exc).__name__, exc)
print(json.dumps(out))
"""


def probe(kind, **env):
    proc = subprocess.run([sys.executable, "-c", PROBE], env={**machine.subprocess_env(kind), **env},
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("kind", ["ascend-cu130", "ascend-cpu"])
def test_the_910b_refuses_float8_npu_tensors_like_torch_npu(kind):
    seen = probe(kind)
    assert seen["name"] == "Ascend910B3"
    assert seen["create"] == seen["factory_like"] == seen["produce"] == \
        "RuntimeError: Float8_e4m3fn has not been supported"
    assert seen["copy"] == "RuntimeError: Float8_e5m2 has not been supported"
    assert seen["bf16"] == "ok: bfloat16 on npu:0"


def test_an_ascend_950_holds_float8_npu_tensors():
    seen = probe("ascend-cpu", TESTBED_NPU_NAME="Ascend950PR")
    assert seen["name"] == "Ascend950PR"
    assert seen["create"] == seen["factory_like"] == seen["produce"] == "ok: float8_e4m3fn on npu:0"
    assert seen["copy"] == "ok: float8_e5m2 on npu:0"
