"""Kernels, device bytes and FLOPs of what the simulated card is asked to run, per (class, op).

An ``Account`` wraps the bed's aten dispatch and the fake torch_npu's call record once
(``install``) and counts only between ``start`` and ``stop``:

* an aten op on npu tensors that makes data (``device_work``: views, allocations and the
  shim's Python kernel entries left out; an op that runs as its decomposition is counted
  as its pieces) is one kernel, charged its tensor inputs read and outputs written;
* a torch_npu op call is one kernel, charged its tensor arguments and its results.

A broadcast input is charged once (its stride-0 dimensions left out). FLOPs: GEMMs 2mnk,
SDPA 4*B*H*Sq*Sk*D, convolutions 2*out*Cin/g*kernel, INT8 GEMMs apart; anything else one per
output element. ``classify()`` names the class of the op being counted, called two frames
below the caller of the bed's dispatch or of the torch_npu op (``real_size_case`` reads the
ComfyUI module it was called from; GEMMs, SDPA and convolutions then get classes of their
own); without one every op is in class ``"step"``.
"""

from __future__ import annotations

import collections
import math

import torch
from torch.utils._pytree import tree_flatten

from testbed import npu_device
from testbed.device_work import ALLOCATION_OPS, ENTRY_OPS, VIEW_OPS, bare

SKIP = VIEW_OPS | ALLOCATION_OPS | ENTRY_OPS | {"_local_scalar_dense", "record_stream"}
GEMM_OPS = {"mm", "addmm", "bmm", "baddbmm", "addbmm", "matmul"}  # matmul: a float linear the bed sees whole (a text encoder's)
CONV_OPS = {"convolution", "_convolution", "conv1d", "conv2d", "conv3d", "convolution_overrideable"}


def nbytes(t) -> int:
    """Device bytes of a tensor as a kernel touches them: stride-0 (broadcast) dims once."""
    if not isinstance(t, torch.Tensor):
        return 0
    n = 1
    for size, stride in zip(t.shape, t.stride()):
        if stride != 0:
            n *= size
    return n * t.element_size()


def tensors_in(flat) -> list:
    """The tensors among a flattened argument list."""
    return [a for a in flat if isinstance(a, torch.Tensor)]


def flops(op: str, args, out) -> float:
    tensors = tensors_in(tree_flatten(args)[0])
    outs = tensors_in(tree_flatten(out)[0])
    if op in GEMM_OPS and len(tensors) >= 2:
        a, b = tensors[-2], tensors[-1]
        return 2.0 * a.numel() * b.shape[-1]
    if op == "scaled_dot_product_attention":
        q, k = tensors[0], tensors[1]
        return 4.0 * q.numel() * k.shape[-2]
    if op in CONV_OPS and len(tensors) >= 2:
        return 2.0 * outs[0].numel() * math.prod(tensors[1].shape[1:])
    return float(sum(o.numel() for o in outs))


class Account:
    """(class, op) -> [kernels, bytes, FLOPs, INT8 ops] of what ran between ``start`` and ``stop``."""

    def __init__(self, classify=None, npu_classes=None) -> None:
        self.classify = classify or (lambda: "step")
        self._named = classify is not None  # class names of its own: GEMMs, SDPA, convolutions get theirs
        self.npu_classes = dict(npu_classes or {})
        self.rows: collections.defaultdict = collections.defaultdict(lambda: [0, 0, 0.0, 0.0])
        self.counting = False
        self._current: list = []  # the torch_npu op whose results are being wrapped

    def install(self) -> "Account":
        from torch_npu import _ops as npu_ops
        from torch_npu import _testbed

        self._bed_dispatch = npu_device._dispatch
        self._bed_record = _testbed.record
        self._bed_out = npu_ops._out
        npu_device._dispatch = self._dispatch
        _testbed.record = self._record_call
        npu_ops._out = self._out
        return self

    def start(self) -> None:
        self.rows.clear()
        self._current.clear()
        self.counting = True

    def stop(self) -> list:
        """``[class, op, kernels, bytes, FLOPs, INT8 ops]`` rows, sorted."""
        self.counting = False
        return [[klass, op, *values] for (klass, op), values in sorted(self.rows.items())]

    def _add(self, klass, op, moved, work, int8=False) -> None:
        row = self.rows[(klass, op)]
        row[0] += 1
        row[1] += moved
        row[3 if int8 else 2] += work

    def _dispatch(self, func, args, kwargs):
        op = bare(func._schema.name)
        if not self.counting or func.namespace not in ("aten", "prims") or op in SKIP or \
                npu_device._runs_as_decomposition(func):
            return self._bed_dispatch(func, args, kwargs)
        klass = self.classify()
        out = self._bed_dispatch(func, args, kwargs)
        if self._named and op in GEMM_OPS:
            klass = klass if klass in ("quantized linears", "other linears") else "other linears"
        elif self._named and op == "scaled_dot_product_attention":
            klass = "attention"
        elif self._named and op in CONV_OPS:
            klass = "convolutions"
        inputs = tensors_in(tree_flatten((args, kwargs))[0])
        outputs = tensors_in(tree_flatten(out)[0])
        self._add(klass, op, sum(map(nbytes, inputs)) + sum(map(nbytes, outputs)), flops(op, (args, kwargs), out),
                  int8=op in GEMM_OPS and bool(inputs) and inputs[0].dtype == torch.int8)
        return out

    def _record_call(self, op, tensors, options, notes=None):
        rec = self._bed_record(op, tensors, options, notes)
        if self.counting:
            present = [t for t in tensors.values() if isinstance(t, torch.Tensor)]
            work = 0.0
            if op == "npu_quant_matmul":
                work = 2.0 * tensors["x1"].numel() * tensors["x2"].shape[-1]
            klass = self.npu_classes.get(op) or self.classify()
            self._add(klass, op, sum(map(nbytes, present)), work, int8=op == "npu_quant_matmul")
            self._current[:] = [(klass, op)]
        return rec

    def _out(self, t, index):
        if self.counting and self._current:
            row = self.rows[self._current[0]]
            row[1] += nbytes(t)
            if self._current[0][1] != "npu_quant_matmul":
                row[2] += t.numel()
        return self._bed_out(t, index)
