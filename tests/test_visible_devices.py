"""ascend_shim.startup.visible_devices: CUDA_VISIBLE_DEVICES carried to ASCEND_RT_VISIBLE_DEVICES,
ascending (ACL takes ids in ascending order only), and the card named first kept as ComfyUI's.

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


def test_carried_over_ascending_where_only_cuda_is_set(capsys):
    env = {CUDA: "3,1"}  # a launcher's order: CUDA computes on card 3
    vd.carry_over(env)
    assert env[ASCEND] == "1,3" and lines(capsys) == []  # ACL takes ids ascending only
    assert vd.default_index() == 1  # card 3 is npu:1
    assert vd.describe(2) == ("2 card(s) visible, chosen by CUDA_VISIBLE_DEVICES=3,1: the NPU got "
                              "ASCEND_RT_VISIBLE_DEVICES=1,3, ComfyUI computes on card 3 = npu:1")


def test_one_card_carried_as_it_is(capsys):
    env = {CUDA: "2"}
    vd.carry_over(env)
    assert env[ASCEND] == "2" and vd.default_index() is None and lines(capsys) == []
    assert vd.describe(1) == ("1 card(s) visible, chosen by CUDA_VISIBLE_DEVICES=2: the NPU got "
                              "ASCEND_RT_VISIBLE_DEVICES=2")


@pytest.mark.parametrize("card", [0, 3, 7])
def test_default_device_leaves_every_card_and_names_none_the_box_lacks(capsys, card):
    """ComfyUI's --default-device N names N, then the other ids up to 31: the NPU is given no
    id (every card of the box stays visible) and card N is the one ComfyUI computes on."""
    cards = list(range(32))
    cards.remove(card)
    env = {CUDA: ",".join(map(str, [card] + cards))}
    vd.carry_over(env)
    assert ASCEND not in env and lines(capsys) == []
    assert vd.default_index() == (card or None)
    vd.after_import(8, env)
    assert lines(capsys) == [] and vd.default_index() == (card or None)
    assert vd.describe(8).endswith(": every card left visible, ComfyUI computes on card %d = npu:%d" % (card, card))


def test_default_device_past_the_last_card_says_so_and_computes_on_card_0(capsys):
    cards = list(range(32))
    cards.remove(9)
    env = {CUDA: ",".join(map(str, [9] + cards))}
    vd.carry_over(env)
    assert ASCEND not in env
    vd.after_import(8, env)
    said = lines(capsys)
    assert len(said) == 1 and "(set by --default-device 9): card 9, named first, is not on this machine" in said[0]
    assert "ComfyUI computes on npu:0" in said[0] and vd.default_index() is None
    assert vd.describe(8).endswith("card 9 is not on this machine: ComfyUI computes on npu:0")


def test_a_first_card_the_box_lacks_is_said_once(capsys):
    env = {CUDA: "7,3"}
    vd.carry_over(env)
    assert env[ASCEND] == "3,7" and vd.default_index() == 1
    vd.after_import(1, env)  # a 4-card box: ACL stops at 7
    said = lines(capsys)
    assert len(said) == 1 and "card 7, named first, is not on this machine" in said[0]
    assert vd.default_index() is None


def test_carrying_twice_keeps_the_first_reading(capsys):
    env = {CUDA: "3,1"}
    vd.carry_over(env)
    vd.carry_over(env)
    assert env[ASCEND] == "1,3" and vd.choice()["variable"] == CUDA and lines(capsys) == []
    assert vd.default_index() == 1


def test_never_over_a_value_the_user_gave_in_order(capsys):
    env = {CUDA: "1", ASCEND: "6"}
    vd.carry_over(env)
    assert env == {CUDA: "1", ASCEND: "6"} and lines(capsys) == [] and vd.default_index() is None
    assert vd.describe(1) == "1 card(s) visible, chosen by ASCEND_RT_VISIBLE_DEVICES=6"
    for value in ["", "2,5", "2,5,x", "-1"]:  # ACL reads each as documented: left as the user gave it
        env = {CUDA: "1", ASCEND: value}
        vd.carry_over(env)
        assert env[ASCEND] == value and vd.default_index() is None and lines(capsys) == []


def test_a_users_value_out_of_order_gets_its_cards_ascending_and_says_so(capsys):
    env = {ASCEND: "3,1"}
    vd.carry_over(env)
    assert env[ASCEND] == "1,3" and vd.default_index() == 1
    assert lines(capsys) == ["ascend_shim: warning: ASCEND_RT_VISIBLE_DEVICES=3,1: ACL accepts card ids in "
                             "ascending order only; the NPU gets 1,3 and ComfyUI computes on card 3 (npu:1), "
                             "the first you named"]
    assert vd.describe(2) == ("2 card(s) visible, chosen by ASCEND_RT_VISIBLE_DEVICES=3,1: the NPU got "
                              "ASCEND_RT_VISIBLE_DEVICES=1,3, ComfyUI computes on card 3 = npu:1")
    vd.after_import(None, env)  # no NPU stack after all: the user's value comes back as it was
    assert env == {ASCEND: "3,1"}


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
    assert env[ASCEND] == "2,6" and vd.default_index() == 1
    assert lines(capsys) == ["ascend_shim: warning: CUDA_VISIBLE_DEVICES='6,2,6': card 6 is named twice, so the "
                             "NPU gets cards 6,2 (what CUDA reads)"]
    env = {CUDA: "7,7,3"}
    vd.carry_over(env)
    assert env[ASCEND] == "7" and vd.default_index() is None and len(lines(capsys)) == 1


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
    assert lines(capsys) == [] and vd.default_index() is None


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
    assert text.startswith("2 card(s) visible, chosen by CUDA_VISIBLE_DEVICES=6,2: the NPU got "
                           "ASCEND_RT_VISIBLE_DEVICES=2,6, ComfyUI computes on card 6 = npu:1"), proc.stdout
