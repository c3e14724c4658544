"""Kernels registered with torch's dispatcher for ops torch_npu lacks."""
