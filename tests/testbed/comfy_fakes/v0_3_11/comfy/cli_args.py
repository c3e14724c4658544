"""Fake ``comfy.cli_args`` (shape v0_3_11, ComfyUI 0.3.11 - 0.3.14).

Only the flags that matter to device detection, precision and memory are
declared.  Of this era: ``--fast`` is a plain switch, ``--cuda-device`` an
int, and there is no ``--disable-mmap``, ``--async-offload``,
``--supports-fp8-compute`` or ``--disable-pinned-memory`` yet.  As upstream:
a strict ``parse_args()`` of ``sys.argv`` when ``comfy.options.args_parsing``
is on, else ``parse_args([])``.
"""
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
fpunet_group.add_argument("--fp32-unet", action="store_true")
fpunet_group.add_argument("--fp64-unet", action="store_true")
fpunet_group.add_argument("--bf16-unet", action="store_true")
fpunet_group.add_argument("--fp16-unet", action="store_true")
fpunet_group.add_argument("--fp8_e4m3fn-unet", action="store_true")
fpunet_group.add_argument("--fp8_e5m2-unet", action="store_true")

fpvae_group = parser.add_mutually_exclusive_group()
fpvae_group.add_argument("--fp16-vae", action="store_true")
fpvae_group.add_argument("--fp32-vae", action="store_true")
fpvae_group.add_argument("--bf16-vae", action="store_true")
parser.add_argument("--cpu-vae", action="store_true")

parser.add_argument("--directml", type=int, nargs="?", const=-1)

attn_group = parser.add_mutually_exclusive_group()
attn_group.add_argument("--use-split-cross-attention", action="store_true")
attn_group.add_argument("--use-quad-cross-attention", action="store_true")
attn_group.add_argument("--use-pytorch-cross-attention", action="store_true")
parser.add_argument("--disable-xformers", action="store_true")

vram_group = parser.add_mutually_exclusive_group()
vram_group.add_argument("--gpu-only", action="store_true")
vram_group.add_argument("--highvram", action="store_true")
vram_group.add_argument("--normalvram", action="store_true")
vram_group.add_argument("--lowvram", action="store_true")
vram_group.add_argument("--novram", action="store_true")
vram_group.add_argument("--cpu", action="store_true")

parser.add_argument("--reserve-vram", type=float, default=None)
parser.add_argument("--disable-smart-memory", action="store_true")
parser.add_argument("--deterministic", action="store_true")
parser.add_argument("--fast", action="store_true")
parser.add_argument("--quick-test-for-ci", action="store_true")
parser.add_argument("--verbose", default="INFO", const="DEBUG", nargs="?")

if comfy.options.args_parsing:
    args = parser.parse_args()
else:
    args = parser.parse_args([])
