"""Start a real ComfyUI's main.py with launcher flags and say which card it computes on.

    python comfy_launch.py <comfyui-dir> <main.py flags...>

main.py runs as ``python main.py`` would (its ``--cuda-device`` / ``--default-device``
environment, then comfy.utils and execution, which imports comfy.model_management, which
imports torch_npu) up to the first import after comfy.model_management has executed (and
the shim patched it): there ComfyUI's device is known. One matmul on it, then the last
stdout line is JSON: ComfyUI's device, the visible cards and the physical card each stands
for (testbed.npu_device), the physical card the matmul ran on, the two variables as
torch_npu read them. The shim's lines are in the process's stderr.
"""

import json
import os
import runpy
import sys

from testbed.absent_packages import stand_in_for

comfy_dir, flags = sys.argv[1], sys.argv[2:]
stand_in_for(("torchvision", "torchaudio"))


def report():
    import torch

    import comfy.model_management as mm
    from testbed import npu_device

    out = {"ascend": os.environ.get("ASCEND_RT_VISIBLE_DEVICES"), "cuda": os.environ.get("CUDA_VISIBLE_DEVICES")}
    try:
        device = mm.get_torch_device()
        count = torch.npu.device_count()
        out.update(device=str(device), count=count,
                   physical=[npu_device.physical_id(i) for i in range(count)])
        npu_device.reset_op_counts(enable=True)
        x = torch.ones(4, 4, device=device)
        (x @ x).sum().item()
        cards = sorted({i for (i, _), n in npu_device.op_counts_by_device().items() if i is not None and n})
        out["computed_on_physical"] = [npu_device.physical_id(i) for i in cards]
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
