"""Accounting for the fake torch_npu: what reached the (simulated) device.

``calls``/``nbytes`` count accepted op calls and the bytes of their tensor
arguments; ``records`` keeps the most recent calls with each tensor argument's
geometry and storage pointer, so tests can check "the weight handed to the op
shares storage with the stored weight".  ``errors`` lists rejected calls.
"""

from __future__ import annotations

import collections
import dataclasses
import threading

import torch

from testbed import npu_device

MAX_RECORDS = 1024

calls: collections.Counter = collections.Counter()
device_calls: collections.Counter = collections.Counter()  # (device of the first tensor, op)
nbytes: collections.Counter = collections.Counter()
counters: collections.Counter = collections.Counter()  # runtime calls: synchronize, empty_cache, ...
records: collections.deque = collections.deque(maxlen=MAX_RECORDS)
errors: list = []  # (op, message) of calls the op rejected
allocator_settings: list = []  # strings given to torch.npu.memory._set_allocator_settings
format_casts: list = []  # (storage_ptr, shape, format)
sdpa_paths: collections.Counter = collections.Counter()  # "fused" / "math": the path torch_npu's SDPA took

_lock = threading.Lock()
_zero_cost = False


@dataclasses.dataclass(frozen=True)
class TensorArg:
    name: str
    shape: tuple
    dtype: torch.dtype
    stride: tuple
    storage_offset: int
    device: str
    data_ptr: int
    storage_ptr: int
    contiguous: bool
    npu_format: int | None


@dataclasses.dataclass(frozen=True)
class CallRecord:
    op: str
    tensors: dict  # name -> TensorArg
    options: dict  # non-tensor arguments
    nbytes: int
    zero_cost: bool
    notes: dict  # op-specific facts, e.g. {"x2_layout": "transposed"}

    def __getitem__(self, name) -> TensorArg:
        return self.tensors[name]


def describe(name: str, t: torch.Tensor) -> TensorArg:
    return TensorArg(
        name=name,
        shape=tuple(t.shape),
        dtype=t.dtype,
        stride=tuple(t.stride()),
        storage_offset=t.storage_offset(),
        device=str(t.device),
        data_ptr=npu_device.unwrap(t).data_ptr(),
        storage_ptr=npu_device.storage_ptr(t),
        contiguous=t.is_contiguous(),
        npu_format=getattr(t, "_testbed_npu_format", None),
    )


def record(op: str, tensors: dict, options: dict, notes: dict | None = None) -> CallRecord:
    present = {k: v for k, v in tensors.items() if isinstance(v, torch.Tensor)}
    size = sum(t.numel() * t.element_size() for t in present.values())
    rec = CallRecord(
        op=op,
        tensors={k: describe(k, v) for k, v in present.items()},
        options=dict(options),
        nbytes=size,
        zero_cost=_zero_cost,
        notes=dict(notes or {}),
    )
    with _lock:
        calls[op] += 1
        device_calls[(str(next(iter(present.values())).device) if present else None, op)] += 1
        nbytes[op] += size
        records.append(rec)
    return rec


def reject(op: str, message: str) -> RuntimeError:
    with _lock:
        errors.append((op, message))
    return RuntimeError(f"{op}: {message}")


def reset() -> None:
    """Forget all calls, records, errors and runtime counters."""
    with _lock:
        calls.clear()
        device_calls.clear()
        nbytes.clear()
        counters.clear()
        records.clear()
        errors.clear()
        allocator_settings.clear()
        format_casts.clear()
        sdpa_paths.clear()


def last(op: str | None = None) -> CallRecord | None:
    """The most recent record (of ``op`` if given)."""
    for rec in reversed(records):
        if op is None or rec.op == op:
            return rec
    return None


def records_for(op: str) -> list:
    return [r for r in records if r.op == op]


def zero_cost(enabled: bool = True) -> bool:
    """Make the quant ops validate but skip the arithmetic (outputs uninitialised).

    For host-overhead benchmarks.  Returns the previous setting.
    """
    global _zero_cost
    prev = _zero_cost
    _zero_cost = bool(enabled)
    return prev


def is_zero_cost() -> bool:
    return _zero_cost
