"""Start a real ComfyUI in a case script's own process, in the order its main.py does.

Every ``*_cases.py`` script runs a real ComfyUI tree's model code without its server:

    from comfyui_start import start_comfyui
    stand_ins = start_comfyui(comfy_dir, flags)
    import comfy.model_management as mm

``start_comfyui`` gives ComfyUI main.py's ``sys.argv`` with the flags, parses its arguments
(``comfy.options.enable_args_parsing``) and imports what main.py imports before any node: with
``cuda_malloc=True`` (main.py's own start) ``comfy.cli_args`` and, where the release has it,
``cuda_malloc`` (it sets ``PYTORCH_CUDA_ALLOC_CONF`` before torch is imported); then it stands
in for torchvision/torchaudio where this torch has no build of them
(``testbed.absent_packages``), imports ``comfy.utils`` (main.py's order) and last
``comfy.model_management``, which imports torch (and torch_npu) and picks the device. What
raises there (a ComfyUI that stops on this machine) reaches the caller.
"""

import importlib
import importlib.util
import os
import sys

from testbed.absent_packages import stand_in_for

STAND_INS = ("torchvision", "torchaudio")


def start_comfyui(comfy_dir, flags=(), *, cuda_malloc=False, stand_ins=STAND_INS):
    """ComfyUI's start-up up to the chosen device; the packages stood in for."""
    sys.path.insert(0, str(comfy_dir))
    sys.argv = [os.path.join(str(comfy_dir), "main.py"), *flags]
    importlib.import_module("comfy.options").enable_args_parsing()
    if cuda_malloc:
        importlib.import_module("comfy.cli_args")
        if importlib.util.find_spec("cuda_malloc"):
            importlib.import_module("cuda_malloc")
    # before anything imports torch (finding a real torchvision imports it), after cuda_malloc
    stood_in = stand_in_for(stand_ins) if stand_ins else []
    if cuda_malloc:
        importlib.import_module("comfy.utils")
    importlib.import_module("comfy.model_management")
    return stood_in
