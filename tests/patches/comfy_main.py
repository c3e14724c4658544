"""Run a real ComfyUI's main.py as ``python main.py <flags>`` would, on the test bed.

    python comfy_main.py <comfyui-dir> <main.py flags...>

torchvision / torchaudio without a build for this torch are stood in for
(testbed.absent_packages); the first stdout line names them.
"""

import os
import runpy
import sys

from testbed.absent_packages import stand_in_for

comfy_dir, flags = sys.argv[1], sys.argv[2:]
print("stand-ins: %s" % ",".join(stand_in_for(("torchvision", "torchaudio"))), flush=True)
sys.path.insert(0, comfy_dir)
sys.argv = [os.path.join(comfy_dir, "main.py"), *flags]
runpy.run_path(sys.argv[0], run_name="__main__")
