"""``torch_npu`` as the product sees it, remembering each op call's arguments and results.

The product's backends are built on a ``RecordingOps`` in place of
``torch_npu``: they make their own calls, and selftest checks each recorded
call against float64 from exactly its inputs.
"""

import dataclasses
import functools
from typing import Any, Callable, Optional

# positional parameter names of the torch_npu calls, for the report
POSITIONAL = {"npu_dynamic_quant": ("input",), "npu_quant_matmul": ("x1", "x2", "scale")}


@dataclasses.dataclass
class Call:
    op: str
    args: tuple
    kwargs: dict
    result: Any = None
    error: Optional[str] = None  # what the call raised


class RecordingOps:
    """A stand-in for ``torch_npu`` whose ``npu_*`` ops record every call."""

    def __init__(self, ops: Any) -> None:
        self._ops = ops
        self.calls: list[Call] = []

    def __getattr__(self, name: str) -> Any:
        target = getattr(self._ops, name)
        if not (name.startswith("npu_") and callable(target)):
            return target
        return functools.partial(self._record, name, target)

    def _record(self, name: str, target: Callable, *args: Any, **kwargs: Any) -> Any:
        call = Call(name, args, kwargs)
        self.calls.append(call)
        try:
            call.result = target(*args, **kwargs)
        except Exception as exc:  # kept for the report; the product may catch it and fall back
            call.error = "%s: %s" % (type(exc).__name__, exc)
            raise
        return call.result

    def first_error(self) -> Optional[str]:
        """What the first recorded call raised, or None."""
        return next((c.error for c in self.calls if c.error is not None), None)


def describe(value: Any) -> Any:
    """A JSON-able description of one argument."""
    import torch

    if isinstance(value, torch.Tensor):
        return {"shape": list(value.shape), "dtype": str(value.dtype), "stride": list(value.stride()),
                "storage_offset": value.storage_offset(), "device": str(value.device),
                "contiguous": value.is_contiguous()}
    if isinstance(value, torch.dtype):
        return str(value)
    return repr(value)


def describe_call(call: Call) -> dict:
    names = POSITIONAL.get(call.op, ())
    args = {names[i] if i < len(names) else "arg%d" % i: describe(a) for i, a in enumerate(call.args)}
    args.update((key, describe(value)) for key, value in call.kwargs.items())
    return {"call": "torch_npu." + call.op, "arguments": args}


def call_text(described: dict) -> str:
    """``torch_npu.npu_quant_matmul(x1=Tensor[37, 80] torch.int8 stride=(80, 1) ..., output_dtype=...)``."""
    parts = []
    for key, value in described["arguments"].items():
        if isinstance(value, dict):
            value = "Tensor%s %s stride=%s offset=%d %s" % (
                value["shape"], value["dtype"], tuple(value["stride"]), value["storage_offset"], value["device"])
        parts.append("%s=%s" % (key, value))
    return "%s(%s)" % (described["call"], ", ".join(parts))
