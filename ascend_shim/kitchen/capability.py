"""Can this torch_npu and CANN run the NPU INT8 path? Decided once, never on a user's call.

Two steps:
  1. when the backend is registered: both ops exist, and
     ``npu_quant_matmul`` takes the keywords the path passes (read from its
     schema or Python signature where it has one);
  2. at first use: one small ``npu_dynamic_quant`` + ``npu_quant_matmul``
     call per output dtype and bias, whose exact answer is known, on the
     device of the call that asked. Every term of its answer matters (row
     maxima, per-token and per-channel scales, a bias of the product's size,
     a zero row, a strided x, shapes off the kernels' tiles), so a device
     that is wrong about any of them fails it.
A combination that fails its probe is declined for the rest of the
process; a call that fails later is that call's problem (an input the
contract let through), not the stack's.
"""

import inspect
import threading
from typing import Any, FrozenSet, Optional, Tuple

import torch

from ascend_shim.engine.npu import is_out_of_memory

QUANT_OPS = ("npu_dynamic_quant", "npu_quant_matmul")
# keywords of npu_quant_matmul the INT8 path passes (pertoken_scale: 2024-03 on)
QUANT_MATMUL_KEYWORDS = ("pertoken_scale", "bias", "output_dtype")


def parameter_names(op: Any) -> Optional[Tuple[FrozenSet[str], bool]]:
    """``(names, open)``: the parameter names ``op`` declares and whether it
    takes any keyword (``**kwargs``); None when neither can be read."""
    overloads = getattr(op, "overloads", None)
    if callable(overloads):  # a torch.ops packet: its schemas
        try:
            names = frozenset(a.name for o in overloads() for a in getattr(op, o)._schema.arguments)
        except Exception:
            return None
        return names, False
    schema = getattr(op, "_schema", None)
    if schema is not None:
        return frozenset(a.name for a in schema.arguments), False
    try:
        parameters = inspect.signature(op).parameters.values()
    except (TypeError, ValueError):  # a builtin without a text signature
        return None
    names = frozenset(p.name for p in parameters if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD))
    return names, any(p.kind is p.VAR_KEYWORD for p in parameters)


def static_problem(ops):
    """None, or why ``ops`` (torch_npu) cannot serve the INT8 path at all."""
    missing = [name for name in QUANT_OPS if not hasattr(ops, name)]
    if missing:
        return "torch_npu lacks %s" % ", ".join(missing)
    declared = parameter_names(ops.npu_quant_matmul)
    if declared is None:
        return None  # unreadable: the probe decides
    names, takes_any = declared
    lacking = [k for k in QUANT_MATMUL_KEYWORDS if k not in names]
    if lacking and not takes_any:
        return "npu_quant_matmul takes no %s (this torch_npu predates per-token scaling)" % (
            ", ".join(lacking))
    return None


# -- the probe: one small call whose exact answer is known -------------------

# odd M past the 128- to 1024-row tiles; K and N off the 16-grid
PROBE_M, PROBE_K, PROBE_N = 1031, 40, 20
ZERO_ROW = 2
# x is passed as a view of a larger tensor: a row offset and a wider row stride
PAD_ROWS, PAD_COLS = 1, 8


def probe_operands():
    """CPU tensors (x, weight, scale, bias) of the probe, every term of which matters.

    Row m of x is ``v[m] * 2**-e[m]`` with e in {1, 2, 3} and |v| = 127 at
    one column, so per-token quantization is exact: scale ``2**-e[m]`` (the
    row maxima differ; dropping the scale is wrong by 2x to 8x) and codes
    ``round(v)``, where every other v is an integer plus 1/4 or 3/4 (no
    ties; truncation differs). Row ``ZERO_ROW`` is zero. The weight scales
    are distinct powers of two per channel, the bias is of the size of the
    product. All of it is exact in fp16 and bf16.
    """
    rows = torch.arange(PROBE_M).reshape(-1, 1)
    cols = torch.arange(PROBE_K).reshape(1, -1)
    v = ((rows * 7 + cols * 13) % 126 - 63).double() + torch.where((rows + cols) % 2 == 0, 0.25, 0.75)
    v[torch.arange(PROBE_M), (torch.arange(PROBE_M) * 5) % PROBE_K] = torch.where(
        torch.arange(PROBE_M) % 2 == 0, 127.0, -127.0).double()
    x = v * 2.0 ** -(1 + torch.arange(PROBE_M) % 3).double().reshape(-1, 1)
    x[ZERO_ROW] = 0
    weight = ((torch.arange(PROBE_N).reshape(-1, 1) * 11 + torch.arange(PROBE_K) * 5) % 255
              - 127).to(torch.int8)
    scale = 2.0 ** -(8 + torch.arange(PROBE_N) % 4).float()
    bias = ((torch.arange(PROBE_N) * 7) % 20 - 10).float() / 2 + 0.25
    return x.float(), weight, scale, bias


def probe_expected(x, weight, scale, bias) -> tuple:
    """The probe's exact answer in float64, and the size of its terms (for the tolerance)."""
    x = x.double()
    rowmax = x.abs().amax(dim=-1, keepdim=True)
    pertoken = rowmax / 127
    codes = torch.round(x / torch.where(rowmax > 0, pertoken, torch.ones_like(pertoken)))
    product = (codes @ weight.double().t()) * scale.double() * pertoken
    if bias is None:
        return product, product.abs()
    return product + bias.double(), product.abs() + bias.double().abs()


COMBINATIONS = tuple((out_dtype, with_bias) for out_dtype in (torch.float16, torch.bfloat16)
                     for with_bias in (False, True))


def _device_view(x: torch.Tensor, device, dtype: torch.dtype) -> torch.Tensor:
    """``x`` on ``device`` as a strided view with a storage offset, as sliced activations come."""
    rows, cols = x.shape
    backing = torch.full((rows + PAD_ROWS, cols + PAD_COLS), 100.0)
    backing[PAD_ROWS:, :cols] = x
    return backing.to(device=device, dtype=dtype)[PAD_ROWS:, :cols]


def probe(ops, device, out_dtype, with_bias):
    """None when the probe call gives the known answer, else what went wrong.

    x goes in as ``out_dtype``; the bias, as the INT8 path passes it, too.
    Every element must be within the output dtype's rounding of the answer.
    """
    from ascend_shim.npu_math import int8 as int8_math

    x, weight, scale, bias = probe_operands()
    bias = bias if with_bias else None
    expected, terms = probe_expected(x, weight, scale, bias)
    out = int8_math.npu_quant_linear(
        _device_view(x, device, out_dtype), weight.to(device), scale.to(device),
        None if bias is None else bias.to(device=device, dtype=out_dtype), out_dtype, ops)
    if tuple(out.shape) != (PROBE_M, PROBE_N) or out.dtype != out_dtype:
        return "returned %s %s, expected %s (%d, %d)" % (out.dtype, tuple(out.shape), out_dtype,
                                                         PROBE_M, PROBE_N)
    # one rounding to out_dtype, plus fp32 rounding of the terms
    tolerance = torch.finfo(out_dtype).eps * expected.abs() + 2.0 ** -20 * terms
    got = out.cpu().double()
    wrong = ~((got - expected).abs() <= tolerance)  # NaN counts as wrong
    if wrong.any():
        m, n = (int(i) for i in wrong.nonzero()[0])
        return "returned a wrong result (%d of %d values off; [%d, %d] = %g, expected %g)" % (
            int(wrong.sum()), wrong.numel(), m, n, got[m, n].item(), expected[m, n].item())
    return None


class Capability:
    """The INT8 path's verdict per (output dtype, bias) on this torch_npu and CANN.

    The op's dtype rules depend on the output dtype and the bias (a bf16 bias
    needs bf16 output, an fp16 bias fp16; older CANN is stricter);
    x is quantized to int8 first, so its dtype does not matter to the matmul.
    """

    def __init__(self, ops, on_broken=None):
        self.ops = ops
        self.problem = static_problem(ops)  # applies to every call
        self._on_broken = on_broken
        self._verdicts = None  # {(out dtype, bias?): None | reason} once probed
        self._lock = threading.Lock()

    def verdict(self, device, out_dtype, with_bias):
        """None when the path runs this combination, else why not.

        The first question probes every combination, on ``device``.
        """
        if self._verdicts is None and not self.problem:
            with self._lock:
                if self._verdicts is None and not self.problem:
                    self._probe_all(device)
        if self.problem:
            return self.problem
        if self._verdicts is None:
            return "probe postponed: the device was out of memory"
        return self._verdicts.get((out_dtype, bool(with_bias)), "%s output not probed" % out_dtype)

    def _probe_all(self, device):
        verdicts = {}
        for out_dtype, with_bias in COMBINATIONS:
            try:
                reason = probe(self.ops, device, out_dtype, with_bias)
            except TypeError as exc:  # the op's signature: no combination can work
                self._broken("npu_quant_matmul probe call raised TypeError: %s" % exc)
                return
            except Exception as exc:
                if is_out_of_memory(exc):
                    return  # undecided: ask again on a later call
                reason = "%s: %s" % (type(exc).__name__, exc)
            verdicts[out_dtype, with_bias] = None if reason is None else "%s output%s: probe failed: %s" % (
                _short(out_dtype), " with bias" if with_bias else "", reason)
        self._verdicts = verdicts
        if all(verdicts.values()):
            self._broken("every probe failed; first: %s" % verdicts[COMBINATIONS[0]])

    def _broken(self, reason):
        self.problem = reason
        if self._on_broken is not None:
            self._on_broken(reason)

    @property
    def probed(self):
        return self._verdicts is not None

    def as_dict(self):
        verdicts = dict(self._verdicts or {})
        return {"problem": self.problem, "probed": self.probed,
                "combinations": {"%s%s" % (_short(o), "+bias" if b else ""): v or "ok"
                                 for (o, b), v in verdicts.items()}}


def _short(dtype):
    return str(dtype).replace("torch.", "")
