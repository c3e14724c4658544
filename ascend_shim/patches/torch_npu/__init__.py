"""Patches to torch_npu and torch's dispatcher: NPU kernels for ops torch_npu lacks, its allocator setting, its fallback warnings."""
