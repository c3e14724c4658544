"""What counts as device work in the benchmarks' op counts on the test bed.

The bed counts every aten op dispatched on npu tensors (``npu_device.op_counts``,
schema names such as ``aten::mm``) and every call of a torch_npu op
(``torch_npu._testbed.calls``). Not every aten op is a device kernel: views make
no new data, an allocation launches nothing, and an op whose NPU kernel is
registered in Python (the shim's ``aten::_int_mm``) is only the entry into the
kernels it runs, which are counted themselves.
"""

# ops that make no new data (a reshape or flatten of a non-contiguous tensor
# copies, so a count that leaves them out can be one kernel per such tensor low)
VIEW_OPS = frozenset({"select", "slice", "view", "unsqueeze", "squeeze", "expand", "permute", "transpose", "t",
                      "alias", "detach", "as_strided", "unbind", "split", "chunk", "narrow", "movedim",
                      "_reshape_alias", "_unsafe_view", "unflatten", "diagonal", "reshape", "flatten",
                      "split_with_sizes", "unsafe_split"})
ALLOCATION_OPS = frozenset({"empty", "empty_strided", "empty_like", "new_empty", "new_empty_strided"})
ENTRY_OPS = frozenset({"_int_mm", "int8_mm", "rms_norm"})  # the shim's Python kernels: their inner ops are counted


def bare(name):
    """``aten::mm`` -> ``mm``."""
    return name.split("::")[-1]


def is_view(name):
    return bare(name) in VIEW_OPS


def kernels(aten_ops, npu_ops=None):
    """Device kernels in a bed count: aten ops that compute, plus torch_npu op calls."""
    skip = VIEW_OPS | ALLOCATION_OPS | ENTRY_OPS
    return sum(n for name, n in aten_ops.items() if bare(name) not in skip) + sum((npu_ops or {}).values())
