"""The one ComfyUI fake the test bed keeps: ``before_ascend_support``.

Every other ComfyUI the suite runs is a real release (harness.comfyui_dir).
All eight of them, from 0.3.10 on, already carry ComfyUI's NPU code
(``is_ascend_npu``, ComfyUI PR #5436). The shim's "leave a ComfyUI that
predates Ascend support alone" guard and doctor's "upgrade ComfyUI" advice
need a ComfyUI without it, which no release here can provide:
``before_ascend_support`` models that ``comfy`` package (options, cli_args,
a model_management with no torch_npu import and no NPU branch, utils without
DISABLE_MMAP, ops) and nothing else.

As upstream: ``comfy`` is a namespace package (no ``__init__.py``);
``comfy.cli_args`` parses ``sys.argv`` only after
``comfy.options.enable_args_parsing()``; without a usable CUDA and without
``--cpu`` the import of ``comfy.model_management`` dies in ``torch.cuda``.
"""
import os

HERE = os.path.dirname(os.path.abspath(__file__))
SHAPES = ("before_ascend_support",)


def shape_path(name):
    if name not in SHAPES:
        raise ValueError(f"unknown ComfyUI fake {name!r}; expected one of {SHAPES}")
    return os.path.join(HERE, name)
