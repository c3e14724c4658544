"""Which card each launcher style lands on: real ComfyUI main.py on 4 and 8 simulated NPUs.

``comfy_launch.py`` runs main.py (its ``--cuda-device`` / ``--default-device`` handling,
then the model code, which imports torch_npu) up to the moment ComfyUI's device is known,
computes one matmul there and one from a fresh thread (as ComfyUI's prompt worker asks), and
says which physical card each ran on. torch_npu obeys only ASCEND_RT_VISIBLE_DEVICES, and
ACL takes its ids in ascending order only (CANN's envref 8.0-9.1); the bed refuses an id out
of order as it refuses an invalid one (reading stops there). ``--default-device`` and
multi-instance launchers (ComfyUI-Distributed starts worker i with
``CUDA_VISIBLE_DEVICES=i``) set the CUDA variable alone, in an order of their own, which the
shim gives ACL ascending before torch_npu reads it, keeping the first card named as the one
ComfyUI computes on in every thread. All runs start at once, as a launcher starts its workers.
"""

import subprocess

import pytest

import harness

LAUNCH = harness.TESTS / "patches" / "comfy_launch.py"
COMFYUI = harness.COMFYUI_USER
TARGET = 2  # the card every style on 4 cards asks for

# case -> (cards on the bed, main.py flags, environment, physical cards visible in torch index
# order, the physical card ComfyUI computes on in every thread, what the shim says on stderr)
STYLES = {
    "--cuda-device": (4, ["--cuda-device", str(TARGET)], {}, [TARGET], TARGET, None),
    "CUDA_VISIBLE_DEVICES": (4, [], {"CUDA_VISIBLE_DEVICES": str(TARGET)}, [TARGET], TARGET, None),
    "ASCEND_RT_VISIBLE_DEVICES": (4, [], {"ASCEND_RT_VISIBLE_DEVICES": str(TARGET)}, [TARGET], TARGET, None),
    "both set": (4, [], {"CUDA_VISIBLE_DEVICES": "1", "ASCEND_RT_VISIBLE_DEVICES": str(TARGET)}, [TARGET],
                 TARGET, None),
}
# an 8-card box (issue 33): every card the user made visible stays visible, ACL gets them
# ascending, ComfyUI computes on the card named first
EIGHT = {
    "--default-device 7": (8, ["--default-device", "7"], {}, list(range(8)), 7, None),
    "--default-device 3": (8, ["--default-device", "3"], {}, list(range(8)), 3, None),
    "CUDA_VISIBLE_DEVICES=7,3": (8, [], {"CUDA_VISIBLE_DEVICES": "7,3"}, [3, 7], 7, None),
}
# what the user meant where it means something, else one clear line; ComfyUI always starts
BAD = {
    "--default-device 9": (8, ["--default-device", "9"], {}, list(range(8)), 0,
                           "(set by --default-device 9): card 9, named first, is not on this machine"),
    "CUDA_VISIBLE_DEVICES=7,7,3": (8, [], {"CUDA_VISIBLE_DEVICES": "7,7,3"}, [7], 7,
                                   "card 7 is named twice, so the NPU gets cards 7 (what CUDA reads)"),
    "ASCEND_RT_VISIBLE_DEVICES=3,1": (8, [], {"ASCEND_RT_VISIBLE_DEVICES": "3,1"}, [1, 3], 3,
                                      "ACL accepts card ids in ascending order only; the NPU gets 1,3 and "
                                      "ComfyUI computes on card 3 (npu:1), the first you named"),
}
CASES = dict(STYLES, **EIGHT, **BAD)

pytestmark = pytest.mark.skipif(not harness.torch_available(), reason="torch is not installed")


@pytest.fixture(scope="module")
def landed(bed_python, tmp_path_factory):
    procs = {}
    for name, (cards, flags, env, _, _, _) in CASES.items():
        home = tmp_path_factory.mktemp("launch")
        procs[name] = subprocess.Popen(
            [str(bed_python), str(LAUNCH), str(harness.comfyui_dir(COMFYUI)), "--disable-all-custom-nodes", *flags],
            env=harness.bed_env("ascend-cu130", kitchen=harness.comfyui_kitchen(COMFYUI),
                                TESTBED_NPU_COUNT=str(cards), **env),
            cwd=str(home), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    done = {}
    for name, proc in procs.items():
        stdout, stderr = proc.communicate(timeout=300)
        done[name] = subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)
    return done


def shim_lines(proc):
    return [line for line in proc.stderr.splitlines() if line.startswith("ascend_shim: ")]


@pytest.mark.parametrize("case", list(CASES))
def test_each_launcher_style_computes_on_the_card_it_means(landed, case):
    _, _, _, visible, card, _ = CASES[case]
    result = harness.last_json(landed[case])
    assert "error" not in result, result
    assert result["physical"] == visible, result  # what ACL read: every card meant, ascending
    device = "npu:%d" % visible.index(card)
    assert result["device"] == device and result["computed_on_physical"] == [card], result
    # the thread that ran ComfyUI's model code at import (its memory figures) was on that card
    assert result["import_thread_card"] == visible.index(card), result
    # and so is a thread ComfyUI starts later, which never chose a card
    assert result["thread"] == {"device": device, "computed_on_physical": [card]}, result
    ascend = result["ascend"]
    if ascend is not None:  # what ACL was given is ascending and names only cards of the box
        ids = [int(i) for i in ascend.split(",")]
        assert ids == sorted(set(ids)) and max(ids) < CASES[case][0], result


@pytest.mark.parametrize("case", list(CASES))
def test_the_shim_says_one_line_exactly_where_the_value_means_less_than_it_says(landed, case):
    said = shim_lines(landed[case])
    expected = CASES[case][5]
    if expected is None:
        assert said == [], said
    else:
        assert len(said) == 1 and expected in said[0], said


def test_the_startup_line_names_the_variable_that_chose_the_cards(landed):
    console = landed["CUDA_VISIBLE_DEVICES"].stdout + landed["CUDA_VISIBLE_DEVICES"].stderr
    assert "ascend_shim active on Ascend910B3 x1 (1 card(s) visible, chosen by CUDA_VISIBLE_DEVICES=2: the NPU " \
           "got ASCEND_RT_VISIBLE_DEVICES=2): patched" in console
    both = landed["both set"].stdout + landed["both set"].stderr
    assert "chosen by ASCEND_RT_VISIBLE_DEVICES=2)" in both and "the NPU got" not in both
    pair = landed["CUDA_VISIBLE_DEVICES=7,3"].stdout + landed["CUDA_VISIBLE_DEVICES=7,3"].stderr
    assert "(2 card(s) visible, chosen by CUDA_VISIBLE_DEVICES=7,3: the NPU got ASCEND_RT_VISIBLE_DEVICES=3,7, " \
           "ComfyUI computes on card 7 = npu:1): patched" in pair
    assert "default_card" in pair.split("): patched ")[1].splitlines()[0]
    seven = landed["--default-device 7"].stdout + landed["--default-device 7"].stderr
    assert "every card left visible, ComfyUI computes on card 7 = npu:7): patched" in seven
