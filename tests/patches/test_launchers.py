"""Which card each launcher style lands on: real ComfyUI 0.30.0 main.py on 4 simulated NPUs.

``comfy_launch.py`` runs main.py (its ``--cuda-device`` / ``--default-device`` handling,
then the model code, which imports torch_npu) up to the moment ComfyUI's device is known,
computes one matmul there and says which physical card it ran on (the bed reads
ASCEND_RT_VISIBLE_DEVICES as ACL does: order kept, reading stops at the first entry that
is not a card). torch_npu obeys only ASCEND_RT_VISIBLE_DEVICES: ``--default-device`` and
multi-instance launchers (ComfyUI-Distributed starts worker i with
``CUDA_VISIBLE_DEVICES=i``) set the CUDA variable alone, which the shim carries over
before torch_npu reads it. All runs start at once, as a launcher starts its workers.
"""

import subprocess

import pytest

import harness

LAUNCH = harness.TESTS / "patches" / "comfy_launch.py"
COMFYUI = "0.30.0"
CARDS = 4
TARGET = 2  # the card every style asks for

# style -> (main.py flags, environment, physical cards visible in order, card computed on)
STYLES = {
    "--cuda-device": (["--cuda-device", str(TARGET)], {}, [TARGET], TARGET),
    "--default-device": (["--default-device", str(TARGET)], {}, [2, 0, 1, 3], TARGET),
    "CUDA_VISIBLE_DEVICES": ([], {"CUDA_VISIBLE_DEVICES": str(TARGET)}, [TARGET], TARGET),
    "ASCEND_RT_VISIBLE_DEVICES": ([], {"ASCEND_RT_VISIBLE_DEVICES": str(TARGET)}, [TARGET], TARGET),
    "both set": ([], {"CUDA_VISIBLE_DEVICES": "1", "ASCEND_RT_VISIBLE_DEVICES": str(TARGET)}, [TARGET], TARGET),
}
# ComfyUI-Distributed's other workers (worker 2 is the CUDA_VISIBLE_DEVICES style above)
WORKERS = {"worker %d" % i: ([], {"CUDA_VISIBLE_DEVICES": str(i)}, [i], i) for i in range(CARDS) if i != TARGET}

pytestmark = pytest.mark.skipif(not harness.torch_available(), reason="torch is not installed")


@pytest.fixture(scope="module")
def landed(bed_python, tmp_path_factory):
    cases = dict(STYLES, **WORKERS)
    procs = {}
    for name, (flags, env, _, _) in cases.items():
        home = tmp_path_factory.mktemp("launch")
        procs[name] = subprocess.Popen(
            [str(bed_python), str(LAUNCH), str(harness.comfyui_dir(COMFYUI)), "--disable-all-custom-nodes", *flags],
            env=harness.bed_env("ascend-cu130", kitchen=harness.comfyui_kitchen(COMFYUI),
                                TESTBED_NPU_COUNT=str(CARDS), **env),
            cwd=str(home), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    done = {}
    for name, proc in procs.items():
        stdout, stderr = proc.communicate(timeout=300)
        done[name] = subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)
    return done


@pytest.mark.parametrize("style", list(STYLES) + list(WORKERS))
def test_each_launcher_style_computes_on_the_card_it_means(landed, style):
    _, _, visible, card = dict(STYLES, **WORKERS)[style]
    result = harness.last_json(landed[style])
    assert "error" not in result, result
    assert result["device"] == "npu:0" and result["physical"] == visible, result
    assert result["computed_on_physical"] == [card], result


def test_the_startup_line_names_the_variable_that_chose_the_cards(landed):
    console = landed["CUDA_VISIBLE_DEVICES"].stdout + landed["CUDA_VISIBLE_DEVICES"].stderr
    assert "ascend_shim active on Ascend910B3 x1 (1 card(s) visible, chosen by CUDA_VISIBLE_DEVICES=2 (carried to " \
           "ASCEND_RT_VISIBLE_DEVICES)): patched" in console
    both = landed["both set"].stdout + landed["both set"].stderr
    assert "chosen by ASCEND_RT_VISIBLE_DEVICES=2)" in both and "carried" not in both
    # nothing to say where a variable ComfyUI sets itself chose: no line of the shim's own
    assert not [line for line in landed["--cuda-device"].stderr.splitlines() if line.startswith("ascend_shim: ")]
