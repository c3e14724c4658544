"""Whether a torch_npu can run the INT8 path: signatures and the probe, on CPU tensors.

The stand-in ops compute the documented semantics of ``npu_dynamic_quant``
and ``npu_quant_matmul`` (torch_npu's op docs) on the CPU; the probe only needs a device its operands can move to.
"""

import pytest
import torch

from ascend_shim.kitchen import capability


def dynamic_quant(x, *, smooth_scales=None):
    xf = x.float()
    inv = 127.0 / xf.abs().amax(dim=-1, keepdim=True)
    q = torch.nan_to_num(torch.round(xf * inv), nan=0.0)  # a zero row: codes 0, scale 0
    return q.clamp(-127, 127).to(torch.int8), (1.0 / inv).squeeze(-1)


def quant_matmul(x1, x2, scale, *, offset=None, pertoken_scale=None, bias=None, output_dtype=None):
    out = (x1.double() @ x2.double()).float() * scale.float() * pertoken_scale.unsqueeze(-1)
    if bias is not None:
        out = out + bias.float()
    return out.to(output_dtype)


class Ops:
    """torch_npu's two quant ops as documented; ``matmul`` swaps in a defective one."""

    def __init__(self, matmul=quant_matmul):
        self.npu_dynamic_quant = dynamic_quant
        self.npu_quant_matmul = matmul
        self.calls = 0

    def count(self):
        """Count the matmul's calls from here on (its signature stays readable)."""
        matmul = self.npu_quant_matmul

        def counted(*args, **kwargs):
            self.calls += 1
            return matmul(*args, **kwargs)

        self.npu_quant_matmul = counted
        return self


def before_pertoken(x1, x2, scale, *, offset=None, bias=None, output_dtype=None):
    return quant_matmul(x1, x2, scale, pertoken_scale=torch.ones(x1.shape[0]), bias=bias,
                        output_dtype=output_dtype)


def opaque(*args, **kwargs):
    if "pertoken_scale" in kwargs:
        raise TypeError("npu_quant_matmul(): got an unexpected keyword argument 'pertoken_scale'")
    return before_pertoken(*args, **kwargs)


def scales_twice(x1, x2, scale, **kwargs):
    return quant_matmul(x1, x2, scale * scale, **kwargs)


def refuses_bf16(x1, x2, scale, *, output_dtype=None, **kwargs):
    if output_dtype == torch.bfloat16:
        raise RuntimeError("bfloat16 output requires a bfloat16 scale on this CANN")
    return quant_matmul(x1, x2, scale, output_dtype=output_dtype, **kwargs)


def test_parameter_names_reads_python_signatures_and_torch_schemas():
    assert capability.parameter_names(quant_matmul)[0] >= {"pertoken_scale", "bias", "output_dtype"}
    assert capability.parameter_names(quant_matmul)[1] is False
    assert capability.parameter_names(opaque) == (frozenset(), True)
    names, takes_any = capability.parameter_names(torch.ops.aten.addmm)  # an OpOverloadPacket
    assert {"self", "mat1", "mat2", "beta", "alpha"} <= names and takes_any is False
    assert capability.parameter_names(torch.ops.aten.addmm.default)[0] >= {"mat1", "mat2"}
    assert capability.parameter_names(len) is not None  # builtins with a text signature
    assert capability.parameter_names(torch._C._get_tracing_state) in (None, (frozenset(), False))


@pytest.mark.parametrize("ops,problem", [
    (Ops(), None),
    (Ops(before_pertoken), "takes no pertoken_scale"),
    (Ops(opaque), None),  # unreadable: the probe decides
])
def test_static_problem(ops, problem):
    found = capability.static_problem(ops)
    assert (found is None) if problem is None else problem in found


def test_static_problem_names_missing_ops():
    class Partial:
        npu_dynamic_quant = staticmethod(dynamic_quant)

    assert capability.static_problem(Partial()) == "torch_npu lacks npu_quant_matmul"


def test_probe_operands_quantize_exactly_and_every_term_matters():
    x, weight, scale, bias = capability.probe_operands()
    for dtype in (torch.float16, torch.bfloat16):
        assert torch.equal(x.to(dtype).float(), x) and torch.equal(bias.to(dtype).float(), bias)
    q, x_scale = dynamic_quant(x.to(torch.bfloat16))
    # per-token scales are exact powers of two, and differ between rows (zero row: 0)
    nonzero = x_scale[x_scale > 0]
    assert torch.equal(torch.log2(nonzero), torch.log2(nonzero).round()) and len(set(nonzero.tolist())) == 3
    assert (x_scale == 0).sum() == 1 and not q[capability.ZERO_ROW].any()
    # codes are x / scale rounded, never a tie, and truncation would change some
    scaled = x.double() / torch.where(x_scale > 0, x_scale, 1).double().reshape(-1, 1)
    assert torch.equal(q.double(), scaled.round())
    assert not ((scaled - scaled.trunc()).abs() == 0.5).any() and not torch.equal(scaled.trunc(), scaled.round())
    # distinct per-channel scales; a bias of the product's size on every column
    assert len(set(scale.tolist())) == 4 and torch.equal(torch.log2(scale), torch.log2(scale).round())
    product, _ = capability.probe_expected(x, weight, scale, None)
    assert (bias.abs() > 0).all() and bias.abs().mean() >= 0.5 * product.abs().median()
    # shapes off the kernels' tiles: odd M past 1024 rows, K and N not multiples of 16
    assert capability.PROBE_M % 2 and capability.PROBE_M > 1024
    assert capability.PROBE_K % 16 and capability.PROBE_N % 16


def test_the_probe_x_reaches_the_op_strided_and_offset():
    seen = []
    ops = Ops()
    quantize = ops.npu_dynamic_quant

    def recording(x, **kwargs):
        seen.append((x.is_contiguous(), x.storage_offset()))
        return quantize(x, **kwargs)

    ops.npu_dynamic_quant = recording
    assert capability.probe(ops, "cpu", torch.bfloat16, True) is None
    assert seen == [(False, capability.PAD_ROWS * (capability.PROBE_K + capability.PAD_COLS))]


def test_a_correct_stack_passes_every_combination_with_one_probe_round():
    ops = Ops()
    cap = capability.Capability(ops)
    ops.count()
    assert cap.verdict("cpu", torch.bfloat16, False) is None
    assert ops.calls == len(capability.COMBINATIONS)
    for out_dtype, with_bias in capability.COMBINATIONS:
        assert cap.verdict("cpu", out_dtype, with_bias) is None
    assert ops.calls == len(capability.COMBINATIONS)  # decided once
    assert cap.as_dict()["combinations"]["float16+bias"] == "ok"


def test_a_stack_that_computes_wrong_is_caught_by_the_probe():
    broken = []
    cap = capability.Capability(Ops(scales_twice), on_broken=broken.append)
    verdict = cap.verdict("cpu", torch.float16, False)
    assert "wrong result" in verdict
    assert broken and "every probe failed" in broken[0] and cap.problem == broken[0]


def test_a_dtype_combination_the_stack_refuses_is_declined_alone():
    broken = []
    cap = capability.Capability(Ops(refuses_bf16), on_broken=broken.append)
    assert cap.verdict("cpu", torch.float16, True) is None
    assert "bfloat16 output requires a bfloat16 scale" in cap.verdict("cpu", torch.bfloat16, False)
    assert not broken and cap.problem is None


def test_a_type_error_turns_the_path_off_for_good():
    broken = []
    ops = Ops(opaque)
    cap = capability.Capability(ops, on_broken=broken.append)
    ops.count()
    assert "TypeError" in cap.verdict("cpu", torch.bfloat16, False)
    assert broken == [cap.problem] and "pertoken_scale" in cap.problem
    calls = ops.calls
    assert cap.verdict("cpu", torch.float16, True) == cap.problem
    assert ops.calls == calls  # never probed again


def test_out_of_memory_leaves_the_question_open():
    state = {"oom": True}

    def sometimes_oom(*args, **kwargs):
        if state["oom"]:
            raise torch.OutOfMemoryError("NPU out of memory. Tried to allocate 2.00 MiB")
        return quant_matmul(*args, **kwargs)

    cap = capability.Capability(Ops(sometimes_oom))
    assert "out of memory" in cap.verdict("cpu", torch.bfloat16, False)
    assert cap.problem is None and not cap.probed
    state["oom"] = False
    assert cap.verdict("cpu", torch.bfloat16, False) is None
