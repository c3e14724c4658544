"""Contract fakes of ComfyUI's ``comfy`` package, one directory per shape.

Put ``shape_path(name)`` on ``sys.path`` / PYTHONPATH in place of a ComfyUI
checkout.  Each shape has ``comfy/{options,cli_args,utils,model_management,
ops}.py`` (no ``comfy/__init__.py``: upstream's ``comfy`` is a namespace
package, and the shim must start on that too), ``comfyui_version.py`` and, except v0_3_10,
``main.py`` + ``cuda_malloc.py``; v0_29 adds ``comfy/quant_ops.py`` (real
comfy_kitchen, any of 0.2.11 - 0.2.40, must be importable).

- ``v0_29``   ComfyUI ~0.30 ("0.30.2", the seed's) with the post-0.29
              ``supports_int8_compute`` / ``comfy.ops.get_disabled_quant_formats``.
- ``v0_30``   ComfyUI 0.30.0: ``QUANT_ALGOS`` adds ``convrot_w4a4`` and
              ``asym_w4a8_int8`` (kitchen 0.2.27+), ``pick_operations``
              never disables an INT8 format, mixed precision loads W4A8 layers.
- ``v0_3_45`` ComfyUI ~0.3.45 API: DISABLE_MMAP, ``pick_operations(...,
              scaled_fp8=None)``, no kitchen / nvfp4 / mxfp8 /
              ``get_all_torch_devices``; pinned-memory constants added anyway.
- ``v0_3_11`` ComfyUI 0.3.11 - 0.3.14: the first Ascend support; ``should_use_bf16``
              without an NPU branch, no ``DISABLE_MMAP`` (``load_torch_file`` maps
              safetensors), none of the later helpers or constants.
- ``v0_3_10`` before Ascend support: no torch_npu, no ``is_ascend_npu``.

As upstream:
- ``comfy.cli_args`` parses ``sys.argv`` only after
  ``comfy.options.enable_args_parsing()`` (``main.py`` does it); a bare
  ``import comfy.model_management`` sees default args.
- On a torch without a usable CUDA and without torch_npu, importing
  ``comfy.model_management`` dies in ``torch.cuda.current_device()`` unless
  ``--cpu`` (or ``comfy.cli_args.args.cpu = True`` before the import).
- ``python <shape>/main.py [flags]`` imports in upstream's order and stops.

Test-bed extras (not upstream names): ``comfy.ops.make_int8_linear`` (v0_29),
and, here, ``shape_path`` and ``tensor_is_file_backed``.  This module must
stay importable without torch.
"""
import os

HERE = os.path.dirname(os.path.abspath(__file__))
SHAPES = ("v0_30", "v0_29", "v0_3_45", "v0_3_11", "v0_3_10")


def shape_path(name):
    if name not in SHAPES:
        raise ValueError(f"unknown ComfyUI fake shape {name!r}; expected one of {SHAPES}")
    return os.path.join(HERE, name)


def _mapping_of(address):
    with open("/proc/self/maps") as maps:
        for line in maps:
            parts = line.split(None, 5)
            lo, hi = (int(x, 16) for x in parts[0].split("-"))
            if lo <= address < hi:
                return parts[5].strip() if len(parts) > 5 else ""
    return None


def tensor_is_file_backed(t):
    """True when ``t``'s storage lies in a mapping of a regular file (Linux
    ``/proc/self/maps``), i.e. its pages fault in from disk on first touch."""
    name = _mapping_of(t.untyped_storage().data_ptr())
    return bool(name) and name.startswith("/") and os.path.isfile(name.split(" (deleted)")[0])
