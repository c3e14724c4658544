"""The bed's current device per thread and its reading of ASCEND_RT_VISIBLE_DEVICES.

ACL binds a device to each thread and torch_npu keeps the index per thread
(``c10_npu::GetDevice``/``SetDevice``, NPUFunctions.cpp): a thread that never set one is
bound to card 0 at its first query (older releases raised ACL error 107002, "The context is
empty"). ACL reads ASCEND_RT_VISIBLE_DEVICES as CANN's envref says: ascending IDs only, up
to the first entry that is not a digit string or names no card; the bed refuses an ID out of
order the same way (reading stops there), so a value ACL does not support never passes. One child interpreter on
a 4-card bed runs every check.
"""

import json
import subprocess
import sys
import textwrap

import pytest

import harness
from testbed import machine

CHILD = r"""
import json, os, threading
import torch
import torch_npu
from testbed import npu_device as nd
from torch_npu import _visible_cards

out = {"main_before": nd.thread_device(), "count": torch.npu.device_count()}
torch.npu.set_device(2)
out["main_after_set"] = torch.npu.current_device()
out["factory_main"] = str(torch.empty(1, device="npu").device)

def worker(name, card):
    seen = {"before": nd.thread_device()}
    if card is not None:
        torch.npu.set_device(card)
    seen["current"] = torch.npu.current_device()
    seen["factory"] = str(torch.empty(1, device="npu").device)
    with torch.npu.device(3):
        seen["inside_context"] = torch.npu.current_device()
    seen["after_context"] = torch.npu.current_device()
    out[name] = seen

nd.reset_implicit_binds()
threads = [threading.Thread(target=worker, args=("chooses", 1), name="chooses"),
           threading.Thread(target=worker, args=("never_sets", None), name="never_sets")]
for t in threads:
    t.start()
    t.join()
out["implicit_binds"] = nd.implicit_binds()
out["main_still"] = torch.npu.current_device()

nd.reset_op_counts(enable=True)
a = torch.ones(2, 2, device="npu:1")
(a @ a).sum()
torch.ones(2, device="npu:3") * 2
out["ops_by_device"] = sorted({str(i) for (i, _), n in nd.op_counts_by_device().items() if n})
nd.reset_op_counts(enable=False)

readings = {}
for value in ["2", "3,1", "7,0,1,2", "0,2,1,3", "1,3,8", "1, 2", "-1", "", "abc", "1,1,2", "0,1,2,3"]:
    os.environ["ASCEND_RT_VISIBLE_DEVICES"] = value
    readings[value] = _visible_cards()
del os.environ["ASCEND_RT_VISIBLE_DEVICES"]
readings[None] = _visible_cards()
out["readings"] = {str(k): v for k, v in readings.items()}
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def child():
    env = machine.subprocess_env("ascend-cu130", env=harness.scrubbed_env(TESTBED_NPU_COUNT="4"))
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(CHILD)], env=env, capture_output=True, text=True,
                          timeout=300, cwd=str(harness.TESTS))
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_the_device_is_per_thread(child):
    assert child["count"] == 4
    assert child["main_after_set"] == 2 and child["factory_main"] == "npu:2"
    chooses = child["chooses"]
    assert chooses["before"] is None  # a new thread inherits nothing from the main thread
    assert chooses["current"] == 1 and chooses["factory"] == "npu:1"
    assert chooses["inside_context"] == 3 and chooses["after_context"] == 1
    assert child["main_still"] == 2


def test_a_thread_that_never_sets_its_card_is_bound_to_card_0_and_noted(child):
    never = child["never_sets"]
    assert never["before"] is None and never["current"] == 0 and never["factory"] == "npu:0"
    assert child["implicit_binds"] == ["never_sets"]


def test_ops_are_counted_per_card(child):
    assert child["ops_by_device"] == ["1", "3"]


def test_ascend_rt_visible_devices_is_read_as_acl_does(child):
    assert child["readings"] == {
        "2": [2], "3,1": [3], "7,0,1,2": [], "0,2,1,3": [0, 2], "1,3,8": [1, 3], "1, 2": [1], "-1": [], "": [], "abc": [], "1,1,2": [1],
        "0,1,2,3": [0, 1, 2, 3], "None": [0, 1, 2, 3]}
