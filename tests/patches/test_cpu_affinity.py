"""``cpu_affinity``: CPU_AFFINITY_CONF with the physical card's cores in a process that sees part of the box.

torch_npu 2.12 takes a card's default core range, and the ``npuN`` of its custom ranges, by the
index the process sees: a Ray worker on physical card 5 is its device 0. The units below check
the rule and torch_npu's reading of a value (NPUAffinityController.cpp); the bed runs check what
each process got: ComfyUI's (every card), a worker-like child on one card that inherits its
environment, a user's value (well-formed and not), a taskset-restricted child, the off switch.
"""

import json
import os

import harness
import pytest

from ascend_shim.patches.torch_npu import cpu_affinity as ca


def decide(environ, count, cores=192, allowed=None, folder="/nonexistent"):
    allowed = set(range(cores)) if allowed is None else allowed
    return ca.decide(dict(environ), count=count, cores=cores, allowed=allowed, folder=folder)


# --- the rule, on a 192-core, 8-card Kunpeng box ---

def test_a_worker_on_card_5_gets_card_5s_share():
    variables, note = decide({"ASCEND_RT_VISIBLE_DEVICES": "5", ca.BOX: "8"}, count=1)
    assert variables == {ca.VARIABLE: "1,npu0:120-143", ca.WRITTEN: "1,npu0:120-143"}
    assert "card 5 = npu:0: cores 120-143 of 192 cores" in note


def test_two_cards_of_eight_each_get_their_own():
    variables, _ = decide({"ASCEND_RT_VISIBLE_DEVICES": "3,7", ca.BOX: "8"}, count=2)
    assert variables[ca.VARIABLE] == "1,npu0:72-95,npu1:168-191"


def test_the_box_is_counted_from_the_drivers_device_files(tmp_path):
    for name in ["davinci%d" % card for card in range(8)] + ["davinci_manager", "devmm_svm"]:
        (tmp_path / name).touch()
    variables, note = decide({"ASCEND_RT_VISIBLE_DEVICES": "2"}, count=1, folder=str(tmp_path))
    assert variables[ca.VARIABLE] == "1,npu0:48-71" and "8 /dev/davinci* device files" in note


def test_every_card_visible_is_left_to_torch_npu_and_the_box_recorded():
    variables, note = decide({}, count=8)
    assert variables == {ca.BOX: "8"}
    assert "CPU_AFFINITY_CONF left unset, torch_npu binds nothing" in note


@pytest.mark.parametrize("environ, count, cores, allowed, why", [
    ({"ASCEND_RT_VISIBLE_DEVICES": "5"}, 1, 192, None, "the box's card count is unknown here"),
    ({"ASCEND_RT_VISIBLE_DEVICES": "5", ca.BOX: "8"}, 1, 4, None, "4 online cores for 8 cards"),
    ({"ASCEND_RT_VISIBLE_DEVICES": "5", ca.BOX: "8"}, 1, 192, set(range(8)),
     "restricted cores (0-7; taskset or cgroups)"),
    ({"ASCEND_RT_VISIBLE_DEVICES": "9", ca.BOX: "8"}, 1, 192, None, "card 9 is not among the box's 8"),
])
def test_nothing_set_where_the_share_cannot_be_known_or_is_not_ours(environ, count, cores, allowed, why):
    variables, note = decide(environ, count=count, cores=cores, allowed=allowed)
    assert variables is None and why in note


def test_a_value_the_shim_wrote_in_a_parent_is_recomputed_for_the_child():
    parent = {"ASCEND_RT_VISIBLE_DEVICES": "5", ca.BOX: "8", ca.VARIABLE: "1,npu0:120-143",
              ca.WRITTEN: "1,npu0:120-143"}
    variables, _ = decide(dict(parent, ASCEND_RT_VISIBLE_DEVICES="6"), count=1)
    assert variables[ca.VARIABLE] == "1,npu0:144-167"


# --- the user's values: kept, and named where torch_npu misreads them ---

@pytest.mark.parametrize("value, named", [
    ("2", "npu0 is physical card 5: without npu0:a-b torch_npu gives it cores 0-191 (192 online cores / 1 "
          "visible card(s), block 0), by the index this process sees, not by card 5"),
    ("abc", "names no mode (0, 1 or 2 first): torch_npu binds nothing"),
    ("npu0:120-143", "names no mode"),
    ("1,npu0:a-b", "npu0:a-b is not a core or a range a-b"),
    ("3", "mode 3 is not documented"),
    ("1,npu5:120-143", "npu5: this process sees 1 card(s), torch_npu ignores it"),
])
def test_the_users_value_is_kept_and_misreadings_named(value, named):
    variables, note = decide({"ASCEND_RT_VISIBLE_DEVICES": "5", ca.BOX: "8", ca.VARIABLE: value}, count=1)
    assert variables is None
    assert note.startswith("CPU_AFFINITY_CONF=%s is yours: kept" % value) and named in note


def test_a_well_formed_value_of_the_users_is_kept_unremarked():
    variables, note = decide({"ASCEND_RT_VISIBLE_DEVICES": "5", ca.BOX: "8",
                              ca.VARIABLE: "2,npu0:120-143"}, count=1)
    assert variables is None and note == "CPU_AFFINITY_CONF=2,npu0:120-143 is yours: kept"


@pytest.mark.parametrize("environ, effect", [
    ({}, (1, "torch_npu's default", None)),
    ({"TASK_QUEUE_ENABLE": "2"}, (2, "yours", None)),
    ({"TASK_QUEUE_ENABLE": "2", "ASCEND_LAUNCH_BLOCKING": "1"}, (0, "ASCEND_LAUNCH_BLOCKING=1 turns the queue off",
                                                                 None)),
    ({"TASK_QUEUE_ENABLE": "abc"}, (0, "yours", "TASK_QUEUE_ENABLE='abc' is read as 0 by torch_npu (strtol)")),
    ({"TASK_QUEUE_ENABLE": "3"}, (None, "yours", "TASK_QUEUE_ENABLE='3': torch_npu refuses it at the first use "
                                                 "of the card (\"TASK_QUEUE_ENABLE should be 0, 1 or 2\")")),
])
def test_task_queue_as_torch_npu_reads_it(environ, effect):
    assert ca.task_queue(environ) == effect


# --- on the bed: what each process got ---

SCENARIO = """
import json, os, subprocess, sys
import torch, torch_npu  # noqa: F401  the watched import: the patch decides here
import ascend_shim

def mine():
    row = {r["name"]: r for r in ascend_shim.status()["patches"]}["cpu_affinity"]
    return {"conf": os.environ.get("CPU_AFFINITY_CONF"), "box": os.environ.get("ASCEND_SHIM_NPU_BOX"),
            "state": row["state"], "reason": row["reason"]}

if len(sys.argv) > 1:  # a child: a Ray worker or a launcher's process, started from the parent
    print(json.dumps(mine()))
    raise SystemExit
children = {}
for name, prefix, extra in json.loads(os.environ.pop("CHILDREN")):
    env = dict(os.environ, **extra)
    out = subprocess.run(prefix + [sys.executable, __file__, "child"], env=env, capture_output=True, text=True)
    children[name] = json.loads(out.stdout.strip().splitlines()[-1]) if out.returncode == 0 else out.stderr
status = subprocess.run([sys.executable, "-m", "ascend_shim", "status"], capture_output=True, text=True,
                        env=dict(os.environ, ASCEND_RT_VISIBLE_DEVICES="1", CPU_AFFINITY_CONF="2"))
print(json.dumps({"parent": mine(), "children": children, "status": status.stdout}))
"""


def test_each_process_on_the_bed(run_bed):
    cores = os.sysconf("SC_NPROCESSORS_ONLN")
    block = cores // 2
    children = [
        ("worker_card_1", [], {"ASCEND_RT_VISIBLE_DEVICES": "1"}),
        ("users_value", [], {"ASCEND_RT_VISIBLE_DEVICES": "1", "CPU_AFFINITY_CONF": "1,npu0:x-y"}),
        ("switched_off", [], {"ASCEND_RT_VISIBLE_DEVICES": "1", "ASCEND_SHIM_DISABLE": "cpu_affinity"}),
        ("taskset", ["taskset", "-c", "0"], {"ASCEND_RT_VISIBLE_DEVICES": "1"}),
        ("eight_card_box", [], {"ASCEND_RT_VISIBLE_DEVICES": "5", "TESTBED_NPU_COUNT": "8",
                                "ASCEND_SHIM_NPU_BOX": "8"}),
    ]
    result = harness.last_json(run_bed(SCENARIO, TESTBED_NPU_COUNT="2", CHILDREN=json.dumps(children)))
    parent, got = result["parent"], result["children"]
    # ComfyUI's process sees both cards: left unbound, the box recorded for what it starts
    assert parent["conf"] is None and parent["box"] == "2" and parent["state"] == "applied", parent
    # a worker on physical card 1 (its device 0) gets card 1's share, not card 0's
    assert got["worker_card_1"]["conf"] == "1,npu0:%d-%d" % (block, 2 * block - 1), got
    assert got["worker_card_1"]["reason"].startswith("CPU_AFFINITY_CONF=1,npu0:")
    assert got["users_value"]["conf"] == "1,npu0:x-y" and got["users_value"]["state"] == "skipped"
    assert "npu0:x-y is not a core or a range a-b (torch_npu ignores it)" in got["users_value"]["reason"]
    assert got["switched_off"]["conf"] is None and got["switched_off"]["state"] == "disabled", got
    if cores > 1:
        assert got["taskset"]["conf"] is None and "restricted cores (0; taskset" in got["taskset"]["reason"]
    eight = got["eight_card_box"]
    if cores >= 8:
        assert eight["conf"] == "1,npu0:%d-%d" % (5 * (cores // 8), 6 * (cores // 8) - 1)
    else:
        assert eight["conf"] is None and "%d online cores for 8 cards" % cores in eight["reason"], eight
    # status shows what its own process got, and names what torch_npu would misread in the user's value
    assert "host dispatch:" in result["status"]
    assert "CPU_AFFINITY_CONF: 2 (yours, kept)" in result["status"]
    assert "torch_npu's reading: npu0 is physical card 1: without npu0:a-b torch_npu gives it" in \
        " ".join(result["status"].split())
    assert "TASK_QUEUE_ENABLE: 1 (torch_npu's default)" in result["status"]
