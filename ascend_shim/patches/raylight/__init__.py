"""Patches to raylight and the xfuser and yunchang code its Ray workers run: NPUs and HCCL instead of CUDA and NCCL."""
