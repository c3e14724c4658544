"""Start a real ComfyUI's main.py with launcher flags and say which card it computes on.

    python comfy_launch.py <comfyui-dir> <main.py flags...>

main.py runs as ``python main.py`` would (its ``--cuda-device`` / ``--default-device``
environment, then comfy.utils and execution, which imports comfy.model_management, which
imports torch_npu) up to the first import after comfy.model_management has executed (and
the shim patched it): there ComfyUI's device is known. One matmul on it, and one from a fresh
thread (as ComfyUI's prompt worker asks), then the last stdout line is JSON: ComfyUI's device,
the visible cards and the physical card each stands for (testbed.npu_device), the card the
model code's thread was bound to at import, the physical card each matmul ran on, the two
variables as torch_npu read them. The shim's lines are in the process's stderr. The bed
reads ASCEND_RT_VISIBLE_DEVICES as ACL does: ascending ids only, reading stops at the first
entry that is not a card.
"""

import json
import os
import runpy
import sys
import threading

from testbed.absent_packages import stand_in_for

comfy_dir, flags = sys.argv[1], sys.argv[2:]
stand_in_for(("torchvision", "torchaudio"))


def computed_on(mm):
    """The physical cards one matmul on ComfyUI's device ran on, asked from the calling thread."""
    import torch

    from testbed import npu_device

    npu_device.reset_op_counts(enable=True)
    device = mm.get_torch_device()
    x = torch.ones(4, 4, device=device)
    (x @ x).sum().item()
    cards = sorted({i for (i, _), n in npu_device.op_counts_by_device().items() if i is not None and n})
    npu_device.reset_op_counts(enable=False)
    return str(device), [npu_device.physical_id(i) for i in cards]


def in_fresh_thread(mm):
    """What a thread ComfyUI starts later (its prompt worker) computes on: the same question from
    a thread that never chose a card."""
    seen = {}

    def worker():
        try:
            seen["device"], seen["computed_on_physical"] = computed_on(mm)
        except BaseException as exc:
            seen["error"] = "%s: %s" % (type(exc).__name__, str(exc).splitlines()[0] if str(exc) else "")

    thread = threading.Thread(target=worker, name="prompt_worker")
    thread.start()
    thread.join(60)
    return seen


def report():
    import torch

    import comfy.model_management as mm
    from testbed import npu_device

    out = {"ascend": os.environ.get("ASCEND_RT_VISIBLE_DEVICES"), "cuda": os.environ.get("CUDA_VISIBLE_DEVICES")}
    try:
        count = torch.npu.device_count()
        out.update(count=count, physical=[npu_device.physical_id(i) for i in range(count)])
        # the card the model code ran on at import: where ComfyUI measured its memory
        out["import_thread_card"] = npu_device.thread_device()
        out["device"], out["computed_on_physical"] = computed_on(mm)
        out["thread"] = in_fresh_thread(mm)
    except BaseException as exc:
        out["error"] = "%s: %s" % (type(exc).__name__, str(exc).splitlines()[0] if str(exc) else "")
    return out


def after_model_management(event, args):
    if event != "import":
        return
    mm = sys.modules.get("comfy.model_management")
    if mm is not None and getattr(mm.__spec__, "_initializing", True) is False:
        print(json.dumps(report()), flush=True)
        sys.stderr.flush()
        os._exit(0)


sys.addaudithook(after_model_management)
sys.path.insert(0, comfy_dir)
sys.argv = [os.path.join(comfy_dir, "main.py"), *flags]
runpy.run_path(sys.argv[0], run_name="__main__")
