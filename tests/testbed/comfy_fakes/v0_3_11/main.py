"""Fake ComfyUI ``main.py`` (shape v0_3_11): enables argument parsing, then
imports cli_args -> cuda_malloc -> comfy.utils (torch) ->
comfy.model_management (torch_npu) -> comfy.ops and stops -- no server."""
import logging
import os
import sys

import comfy.options
comfy.options.enable_args_parsing()

from comfy.cli_args import args  # noqa: E402

if args.cuda_device is not None:
    os.environ["CUDA_VISIBLE_DEVICES"] = str(args.cuda_device)
    os.environ["HIP_VISIBLE_DEVICES"] = str(args.cuda_device)

import cuda_malloc  # noqa: E402,F401

if "torch" in sys.modules:
    logging.warning("WARNING: Potential Error in code: Torch already imported, torch should never be imported before this point.")

import comfy.utils  # noqa: E402,F401
import comfy.model_management  # noqa: E402,F401
import comfy.ops  # noqa: E402,F401

if __name__ == "__main__":
    print("fake ComfyUI main: imports done")
