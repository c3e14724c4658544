"""ascend_shim.startup.visible_devices: CUDA_VISIBLE_DEVICES carried to ASCEND_RT_VISIBLE_DEVICES.

In-process, with a dict as the environment (the module is stdlib only). That it runs right
before torch_npu executes in a real ComfyUI, and which card that lands on, is
tests/patches/test_launchers.py.
"""

import pytest

from ascend_shim.startup import visible_devices as vd

CUDA, ASCEND = vd.CUDA, vd.ASCEND


def lines(capsys):
    return [line for line in capsys.readouterr().err.splitlines() if line.startswith("ascend_shim: ")]


@pytest.mark.parametrize("value, cards, problem", [
    ("6", [6], None),
    ("1,0,2,3", [1, 0, 2, 3], None),  # --default-device 1: order kept
    (" 2 , 3", [2, 3], None),
    ("", [], "the value is empty"),
    ("  ", [], "the value is empty"),
    ("-1", [], "'-1' is not a card index"),
    ("abc", [], "'abc' is not a card index"),
    ("GPU-5f1c2d", [], "'GPU-5f1c2d' is not a card index"),  # a CUDA UUID names no NPU
    ("0,1,abc,2", [0, 1], "'abc' is not a card index"),
    ("6,2,6", [6, 2], "card 6 is named twice"),
    ("٣", [], "'٣' is not a card index"),  # a non-ASCII digit
])
def test_parse_reads_as_cuda_does(value, cards, problem):
    assert vd.parse(value) == (cards, problem)


def test_carried_over_where_only_cuda_is_set(capsys):
    env = {CUDA: "3,1"}
    vd.carry_over(env)
    assert env[ASCEND] == "3,1" and lines(capsys) == []
    assert vd.describe(2) == ("2 card(s) visible, chosen by CUDA_VISIBLE_DEVICES=3,1 "
                              "(carried to ASCEND_RT_VISIBLE_DEVICES)")


def test_carrying_twice_keeps_the_first_reading(capsys):
    env = {CUDA: "3,1"}
    vd.carry_over(env)
    vd.carry_over(env)
    assert env[ASCEND] == "3,1" and vd.choice()["variable"] == CUDA and lines(capsys) == []


def test_never_over_a_value_the_user_gave(capsys):
    env = {CUDA: "1", ASCEND: "6"}
    vd.carry_over(env)
    assert env == {CUDA: "1", ASCEND: "6"} and lines(capsys) == []
    assert vd.describe(1) == "1 card(s) visible, chosen by ASCEND_RT_VISIBLE_DEVICES=6"
    env = {CUDA: "1", ASCEND: ""}  # an empty value is the user's too
    vd.carry_over(env)
    assert env[ASCEND] == ""


def test_nothing_set_nothing_changes(capsys):
    env = {}
    vd.carry_over(env)
    assert env == {} and vd.choice() == {} and lines(capsys) == []


@pytest.mark.parametrize("value", ["", "-1", "abc"])
def test_a_value_naming_no_card_leaves_the_npu_and_says_so_once(capsys, value):
    env = {CUDA: value}
    vd.carry_over(env)
    assert ASCEND not in env
    said = lines(capsys)
    assert len(said) == 1 and "names no card" in said[0] and "the NPU cards stay as they are" in said[0]
    vd.after_import(8, env)
    assert lines(capsys) == [] and vd.describe(8).startswith("all 8 card(s) visible (CUDA_VISIBLE_DEVICES=")


def test_a_repeated_card_ends_the_reading_with_one_line(capsys):
    env = {CUDA: "6,2,6"}
    vd.carry_over(env)
    assert env[ASCEND] == "6,2"
    assert lines(capsys) == ["ascend_shim: warning: CUDA_VISIBLE_DEVICES='6,2,6': card 6 is named twice, so the "
                             "NPU gets cards 6,2 (what CUDA reads)"]


def test_cards_past_the_last_are_left_to_acl_and_none_left_is_said(capsys):
    env = {CUDA: "9"}
    vd.carry_over(env)
    assert env[ASCEND] == "9"
    vd.after_import(0, env)
    said = lines(capsys)
    assert len(said) == 1 and "names no card of this machine" in said[0]
    env = {CUDA: "1,3,8"}  # ACL reads 1,3 on 8 cards, as CUDA would: nothing to say
    vd.carry_over(env)
    vd.after_import(2, env)
    assert lines(capsys) == []


def test_taken_back_where_torch_npu_does_not_import(capsys):
    env = {CUDA: "2"}
    vd.carry_over(env)
    vd.after_import(None, env)  # no NPU stack: no trace left for child processes
    assert env == {CUDA: "2"} and lines(capsys) == []


@pytest.mark.parametrize("command, label", [("status", "\n  cards "), ("doctor", "\nNPU cards ")])
def test_status_and_doctor_name_the_cards_and_the_variable(bed_python, tmp_path, command, label):
    import harness

    env = harness.bed_env("ascend-cu130", TESTBED_NPU_COUNT="8", CUDA_VISIBLE_DEVICES="6,2")
    proc = harness.run([str(bed_python), "-m", "ascend_shim", command], env, tmp_path)
    shown = proc.stdout.split(label)[1].split("\n")[0:2]  # status wraps at its width
    text = " ".join(" ".join(shown).split())
    assert text.startswith("2 card(s) visible, chosen by CUDA_VISIBLE_DEVICES=6,2 (carried to "
                           "ASCEND_RT_VISIBLE_DEVICES)"), proc.stdout
