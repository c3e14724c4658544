"""Run a real ComfyUI's own ``tests-unit`` in this interpreter, with a JUnit report.

    python comfy_unit.py <comfyui-dir> <junit.xml> <tests-unit paths...>

torchvision / torchaudio without a build for this torch are stood in for
(testbed.absent_packages), as in comfy_main.py; the first stdout line names them.
"""

import os
import sys

import pytest

from testbed.absent_packages import stand_in_for

comfy_dir, junit, paths = sys.argv[1], sys.argv[2], sys.argv[3:]
print("stand-ins: %s" % ",".join(stand_in_for(("torchvision", "torchaudio"))), flush=True)
os.chdir(comfy_dir)
sys.path.insert(0, comfy_dir)
sys.exit(pytest.main(["-q", "-p", "no:cacheprovider", "--junitxml", junit,
                      "-o", "asyncio_mode=auto", *paths]))
