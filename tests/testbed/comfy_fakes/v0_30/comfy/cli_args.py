"""Fake ``comfy.cli_args`` (shape v0_29, ComfyUI ~0.30).

Only the flags that matter to device detection, memory management, mmap and
quantization are declared.  As upstream: a strict ``parse_args()`` of
``sys.argv`` when ``comfy.options.args_parsing`` is on, else ``parse_args([])``.
"""
import argparse
import enum

import comfy.options

parser = argparse.ArgumentParser()
parser.add_argument("--listen", type=str, default="127.0.0.1", nargs="?", const="0.0.0.0,::")
parser.add_argument("--port", type=int, default=8188)
parser.add_argument("--cuda-device", type=str, default=None, metavar="DEVICE_ID")
parser.add_argument("--default-device", type=int, default=None)
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
fpunet_group.add_argument("--fp8_e8m0fnu-unet", action="store_true")

fpvae_group = parser.add_mutually_exclusive_group()
fpvae_group.add_argument("--fp16-vae", action="store_true")
fpvae_group.add_argument("--fp32-vae", action="store_true")
fpvae_group.add_argument("--bf16-vae", action="store_true")
parser.add_argument("--cpu-vae", action="store_true")

fpte_group = parser.add_mutually_exclusive_group()
fpte_group.add_argument("--fp8_e4m3fn-text-enc", action="store_true")
fpte_group.add_argument("--fp8_e5m2-text-enc", action="store_true")
fpte_group.add_argument("--fp16-text-enc", action="store_true")
fpte_group.add_argument("--fp32-text-enc", action="store_true")
fpte_group.add_argument("--bf16-text-enc", action="store_true")

parser.add_argument("--directml", type=int, nargs="?", const=-1)
parser.add_argument("--supports-fp8-compute", action="store_true")
parser.add_argument("--enable-triton-backend", action="store_true")

attn_group = parser.add_mutually_exclusive_group()
attn_group.add_argument("--use-split-cross-attention", action="store_true")
attn_group.add_argument("--use-quad-cross-attention", action="store_true")
attn_group.add_argument("--use-pytorch-cross-attention", action="store_true")
attn_group.add_argument("--use-sage-attention", action="store_true")
attn_group.add_argument("--use-flash-attention", action="store_true")
parser.add_argument("--disable-xformers", action="store_true")

vram_group = parser.add_mutually_exclusive_group()
vram_group.add_argument("--gpu-only", action="store_true")
vram_group.add_argument("--highvram", action="store_true")
vram_group.add_argument("--lowvram", action="store_true")
vram_group.add_argument("--novram", action="store_true")
vram_group.add_argument("--cpu", action="store_true")

parser.add_argument("--reserve-vram", type=float, default=None)
parser.add_argument("--async-offload", nargs="?", const=2, type=int, default=None, metavar="NUM_STREAMS")
parser.add_argument("--disable-async-offload", action="store_true")
parser.add_argument("--disable-dynamic-vram", action="store_true")
parser.add_argument("--force-non-blocking", action="store_true")
parser.add_argument("--disable-smart-memory", action="store_true")
parser.add_argument("--deterministic", action="store_true")


class PerformanceFeature(enum.Enum):
    Fp16Accumulation = "fp16_accumulation"
    Fp8MatrixMultiplication = "fp8_matrix_mult"
    CublasOps = "cublas_ops"
    AutoTune = "autotune"


parser.add_argument("--fast", nargs="*", type=PerformanceFeature)
parser.add_argument("--disable-pinned-memory", action="store_true")
parser.add_argument("--mmap-torch-files", action="store_true")
parser.add_argument("--disable-mmap", action="store_true")
parser.add_argument("--quick-test-for-ci", action="store_true")
parser.add_argument("--verbose", default="INFO", const="DEBUG", nargs="?")

if comfy.options.args_parsing:
    args = parser.parse_args()
else:
    args = parser.parse_args([])

if args.force_fp16:
    args.fp16_unet = True

# --fast absent: nothing; bare --fast: every feature; else the listed ones.
if args.fast is None:
    args.fast = set()
elif args.fast == []:
    args.fast = set(PerformanceFeature)
else:
    args.fast = set(args.fast)
