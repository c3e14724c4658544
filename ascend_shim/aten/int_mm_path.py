"""Which arithmetic serves ``aten::_int_mm`` on the NPU: the INT8 cube or fp32 K-chunks.

``npu_quant_matmul(x1, x2, ones, output_dtype=torch.int32)`` (op-plugin
7.0.0+, Atlas A2) is one INT8-cube call. Older op-plugins refuse int32
output, and an op that rounds its int32 answer through a float type would be
a silent wrong number, so the path is trusted only after one tiny on-device
call whose exact int32 answer is known (``int8.int32_probe_operands``) gives
that answer bit for bit. It is asked once per installation, on the first
call (never at import or startup), under a lock; anything else (a refusal,
any other answer, uint8 ``self``) runs the exact fp32-chunk GEMMs.
"""

from __future__ import annotations

import sys
import threading
from typing import Any, Dict, Optional

import torch

from ascend_shim.npu_math import int8 as int8_math

CUBE = "npu_quant_matmul int32 (INT8 cube)"
FP32_CHUNKS = "fp32 GEMMs over K-chunks"


class ProductPath:
    """Decides once, lazily, whether the INT8-cube path is exact here; then serves products."""

    def __init__(self, ops: Any = None) -> None:
        self._ops = ops  # torch_npu; looked up when first needed if not given
        self._lock = threading.Lock()
        self._decided = False
        self._cube = False
        self._why = "not decided yet: the first _int_mm call on the NPU decides"
        self._unit_scales: Dict[Any, Any] = {}
        self.cube_calls = 0
        self.fp32_calls = 0

    # ------------------------------------------------------------------ deciding
    def _torch_npu(self) -> Any:
        return self._ops if self._ops is not None else sys.modules.get("torch_npu")

    def _unit_scale(self, device: Any) -> Any:
        scale = self._unit_scales.get(device)
        if scale is None:
            scale = torch.ones(1, dtype=torch.float32, device=device)
            self._unit_scales[device] = scale
        return scale

    def _probe(self, device: Any) -> tuple:
        """(usable, why): the probe's answer on ``device`` against the exact int32 product."""
        ops = self._torch_npu()
        if getattr(ops, "npu_quant_matmul", None) is None:
            return False, "torch_npu has no npu_quant_matmul"
        a, b, want = int8_math.int32_probe_operands()
        try:
            got = int8_math.quant_int_mm(a.to(device), b.to(device), ops, self._unit_scale(device))
            got = got.to("cpu")
        except Exception as exc:  # the op refusing int32 output is the expected case here
            return False, "npu_quant_matmul refused int32 output (%s: %s)" % (
                type(exc).__name__, str(exc).splitlines()[0] if str(exc) else "")
        if got.dtype != torch.int32 or tuple(got.shape) != tuple(want.shape):
            return False, "npu_quant_matmul int32 output came back as %s %s, expected torch.int32 %s" % (
                got.dtype, list(got.shape), list(want.shape))
        wrong = int((got != want).sum().item())
        if wrong:
            return False, ("npu_quant_matmul int32 output is inexact: %d of %d probe elements differ "
                           "from the exact product (e.g. %d for %d)"
                           % (wrong, want.numel(), int(got[got != want][0]), int(want[got != want][0])))
        return True, "npu_quant_matmul gave the exact int32 probe product (sums past 2**24, int8 extremes)"

    def decide(self, device: Any) -> bool:
        """Whether products on ``device`` use the INT8 cube; probes on the first call only."""
        if self._decided:
            return self._cube
        with self._lock:
            if not self._decided:
                self._cube, self._why = self._probe(device)
                self._decided = True
        return self._cube

    # ------------------------------------------------------------------ serving
    def product(self, a: Any, b: Any) -> Any:
        """The exact int32 ``a @ b`` on a's device, by the decided path."""
        if a.dtype == torch.int8 and self.decide(a.device):
            self.cube_calls += 1
            return int8_math.quant_int_mm(a, b, self._torch_npu(), self._unit_scale(a.device))
        self.fp32_calls += 1
        return int8_math.exact_int_mm(a, b)

    def forced(self, a: Any, b: Any, cube: bool) -> Any:
        """One path regardless of the decision (``selftest`` and ``bench`` compare both)."""
        if cube:
            return int8_math.quant_int_mm(a, b, self._torch_npu(), self._unit_scale(a.device))
        return int8_math.exact_int_mm(a, b)

    def report(self) -> Dict[str, Optional[Any]]:
        """``path``: what serves int8 ``self`` now (None until decided); ``why``; calls per path."""
        path = None
        if self._decided:
            path = CUBE if self._cube else FP32_CHUNKS
        return {"path": path, "why": self._why, "cube_calls": self.cube_calls,
                "fp32_calls": self.fp32_calls}
