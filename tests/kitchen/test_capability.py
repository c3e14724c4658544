"""Whether a torch_npu can run the INT8 path: signatures and the probe, on CPU tensors.

The stand-in ops compute the documented semantics (FACTS 4.1, 4.2) on the
CPU; the probe only needs a device its operands can move to.
"""

import pytest
import torch

from ascend_shim.kitchen import capability


def dynamic_quant(x, *, smooth_scales=None):
    xf = x.float()
    inv = 127.0 / xf.abs().amax(dim=-1, keepdim=True)
    return torch.round(xf * inv).clamp(-127, 127).to(torch.int8), (1.0 / inv).squeeze(-1)


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


def test_probe_operands_quantize_exactly():
    x, weight, scale, bias = capability.probe_operands()
    q, x_scale = dynamic_quant(x.to(torch.bfloat16))
    assert torch.equal(x_scale, torch.ones(capability.PROBE_M))
    assert torch.equal(q.float(), x)
    assert weight.dtype == torch.int8 and torch.equal(torch.log2(scale), torch.log2(scale).round())


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
