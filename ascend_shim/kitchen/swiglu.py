"""The SwiGLU of the INT8 path's ``input_act="swiglu"`` on one ``npu_swiglu`` kernel.

comfy-kitchen applies ``silu(gate) * up`` (``[gate | up]`` halves of the last
dim) before quantizing: a chunk, a silu and a multiply, each writing the
activation out at the input's dtype. ``npu_swiglu`` (torch_npu: ``swish(A) *
B``, A the first half) is one kernel. The two differ by output rounding only:
eager rounds silu's result to the input dtype before the multiply, the fused
op rounds once: in bf16 at most one unit in the last place apart (measured on
MiniMax-H3's MLP shapes; the bed computes the op in fp32 with one rounding,
which a real card must confirm). fp16 is left to eager: where silu(gate) is
an fp16 subnormal, eager's rounding of it moves the product by up to 5 units.

Taken on NPU tensors of bf16/fp32 with an even, non-empty last dim, once a
one-call probe on the device gave the known answer; everything else, and a
refusal by the op, runs kitchen's eager activation.
"""

from __future__ import annotations

import collections
import threading
from typing import Any, Callable, Dict, Optional

import torch

from ascend_shim.engine.npu import is_out_of_memory

FLOATS = (torch.bfloat16, torch.float32)  # fp16: see the module's docstring
OP_ERRORS = (RuntimeError, TypeError, ValueError)


def probe(op: Callable, device: Any) -> Optional[str]:
    """None when ``npu_swiglu`` gives a known answer on ``device``, else why not."""
    # silu(0) = 0, silu(a) * 0 = 0 and silu(a) * 1 = silu(a): the answer is exact in fp32,
    # and the halves' order shows (the second half is never passed through silu)
    a = torch.tensor([[0.0, 1.0, -1.0, 2.0], [3.0, 0.0, -2.0, 0.5]])
    b = torch.tensor([[1.0, 1.0, 0.0, 1.0], [0.0, 1.0, 1.0, -1.0]])
    got = op(torch.cat((a, b), dim=-1).to(device), -1).cpu()
    want = torch.nn.functional.silu(a) * b
    if got.shape != want.shape or not torch.allclose(got, want, rtol=2 ** -20, atol=0):
        return "npu_swiglu probe returned a wrong result"
    return None


class SwigluPath:
    """``input_act="swiglu"`` for one torch_npu: fused where it may, else eager's function."""

    def __init__(self, ops: Any) -> None:
        self.op: Optional[Callable] = getattr(ops, "npu_swiglu", None)
        self._verdicts: Dict[str, Optional[str]] = {}
        self._lock = threading.Lock()
        self.calls: collections.Counter = collections.Counter()

    def verdict(self, device: Any) -> Optional[str]:
        if self.op is None:
            return "torch_npu has no npu_swiglu"
        key = str(device)
        if key not in self._verdicts:
            try:
                found = probe(self.op, device)
            except Exception as exc:  # a refusal: the op is not used on this device
                found = "npu_swiglu probe raised %s: %s" % (type(exc).__name__, exc)
            with self._lock:
                self._verdicts.setdefault(key, found)
        return self._verdicts[key]

    def decline(self, x: Any) -> Optional[str]:
        if x.device.type != "npu":
            return "not an NPU tensor"
        if x.dtype not in FLOATS:
            return "dtype %s" % x.dtype
        if x.dim() < 1 or x.dim() > 8 or x.numel() == 0 or x.shape[-1] % 2:
            return "shape eager decides"
        return self.verdict(x.device)

    def apply(self, x: Any, eager: Callable[[Any], Any]) -> Any:
        """swiglu(x) on ``npu_swiglu`` where it may serve ``x``, else ``eager(x)``."""
        op, reason = self.op, self.decline(x)
        if reason or op is None:
            self._count("declined: %s" % reason)
            return eager(x)
        try:
            out = op(x.contiguous(), -1)
        except OP_ERRORS as exc:
            if is_out_of_memory(exc):
                raise
            self._count("to_eager")
            return eager(x)
        self._count("fused")
        return out

    def _count(self, key: str) -> None:
        with self._lock:
            self.calls[key] += 1

    def report(self) -> Dict[str, Any]:
        with self._lock:
            return {"available": self.op is not None,
                    "probes": {device: verdict or "ok" for device, verdict in self._verdicts.items()},
                    "calls": dict(self.calls)}
