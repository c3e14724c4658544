"""Fake ``comfy.cli_args`` (before_ascend_support) before Ascend support, before
``--supports-fp8-compute``/``--disable-mmap``; ``--fast`` is still a plain switch)."""
import argparse

import comfy.options

parser = argparse.ArgumentParser()
parser.add_argument("--listen", type=str, default="127.0.0.1", nargs="?", const="0.0.0.0,::")
parser.add_argument("--port", type=int, default=8188)
parser.add_argument("--cuda-device", type=int, default=None, metavar="DEVICE_ID")
cm_group = parser.add_mutually_exclusive_group()
cm_group.add_argument("--cuda-malloc", action="store_true")
cm_group.add_argument("--disable-cuda-malloc", action="store_true")
fp_group = parser.add_mutually_exclusive_group()
fp_group.add_argument("--force-fp32", action="store_true")
fp_group.add_argument("--force-fp16", action="store_true")
fpunet_group = parser.add_mutually_exclusive_group()
for flag in ("--fp32-unet", "--fp64-unet", "--bf16-unet", "--fp16-unet", "--fp8_e4m3fn-unet", "--fp8_e5m2-unet"):
    fpunet_group.add_argument(flag, action="store_true")
parser.add_argument("--cpu-vae", action="store_true")
parser.add_argument("--directml", type=int, nargs="?", const=-1)
vram_group = parser.add_mutually_exclusive_group()
for flag in ("--gpu-only", "--highvram", "--lowvram", "--novram", "--cpu"):
    vram_group.add_argument(flag, action="store_true")
parser.add_argument("--reserve-vram", type=float, default=None)
parser.add_argument("--disable-smart-memory", action="store_true")
parser.add_argument("--deterministic", action="store_true")
parser.add_argument("--fast", action="store_true")

if comfy.options.args_parsing:
    args = parser.parse_args()
else:
    args = parser.parse_args([])

if args.force_fp16:
    args.fp16_unet = True
