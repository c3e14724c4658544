"""The NPU INT8 backend against every supported comfy-kitchen release, on the test bed.

Each (release, suite) runs ``int8_cases.py`` once in a fresh interpreter of a
venv with the shim wheel installed, on the simulated Ascend machine; the
tests below assert on what it measured. Thresholds: cosine >= 0.99995 and
relative MAE <= 1% against a float32 dequantized reference; the INT8
arithmetic itself (per-token quantization, scales applied once) is checked
against a per-token reference at cosine >= 0.99999.
"""

import json

import pytest

import harness

VERSIONS = harness.KITCHEN_VERSIONS
CASES = harness.TESTS / "kitchen" / "int8_cases.py"


@pytest.fixture(scope="session")
def kitchen_run(bed_python, tmp_path_factory):
    cache = {}

    def run(version, suite, flags=(), **env):
        key = (version, suite, flags, tuple(sorted(env.items())))
        if key not in cache:
            cwd = tmp_path_factory.mktemp("kitchen")
            proc = harness.run([str(bed_python), *flags, str(CASES), suite],
                               harness.bed_env("ascend-cu130", kitchen=version, **env), cwd, timeout=600)
            cache[key] = harness.last_json(proc)
        return cache[key]

    return run


def by_name(result):
    return {case["name"]: case for case in result["cases"]}


def assert_on_device(case, served_by_shim=True):
    assert "error" not in case, case
    assert case["cpu_fallbacks"] == [], case["name"]
    assert case["dynamic_quant"] == 1 and case["quant_matmul"] == 1, case
    assert case["weight_shares_storage"] is True, case["name"]
    assert case["weight_passed_transposed"] == "transposed", case["name"]
    assert case["device"] == "npu:0"
    if served_by_shim:
        assert case["served_npu_quant"] == 1, case["name"]


def assert_accurate(case, metrics="cos"):
    assert case["cos"] >= 0.99995, (case["name"], case["cos"])
    assert case["rel_mae"] <= 0.01, (case["name"], case["rel_mae"])
    assert 0.99 <= case["norm_ratio"] <= 1.01, (case["name"], case["norm_ratio"])
    if "int8" in case:
        assert case["int8"]["cos"] >= 0.99999, (case["name"], case["int8"])


def upstream_first(version):
    return version >= "0.2.36"


@pytest.mark.parametrize("version", VERSIONS)
def test_grid_runs_on_the_npu_and_matches_the_reference(kitchen_run, version):
    result = kitchen_run(version, "grid")
    cases = result["cases"]
    names = [c["name"] for c in cases]
    # 2-D/3-D x fp16/bf16 x scale (), [N], [N,1] x bias: 24 public calls, 16 through F.linear
    assert sum(n.startswith("ck:") and n[3] in "23" for n in names) == 24
    assert sum(n.startswith("F.linear:") and n[9] in "23" for n in names) == 16
    assert {"ck:convrot-16", "ck:convrot-64", "ck:convrot-256", "F.linear:convrot-64"} <= set(names)
    for case in cases:
        assert_on_device(case, served_by_shim=not upstream_first(version))
        assert_accurate(case)
        if "backend" in case:
            assert case["backend"] == ("ascend" if upstream_first(version) else "ascend_shim")


def test_modulated_variants_stay_on_the_npu(kitchen_run):
    """kitchen 0.2.38+ int8_linear_(rms_)modulated: eager would compose them over _int_mm."""
    cases = by_name(kitchen_run("0.2.40", "grid"))
    for name in ("ck:modulated", "ck:rms-modulated"):
        assert_on_device(cases[name])  # served by the shim: upstream has no modulated kernel
        assert_accurate(cases[name])


@pytest.mark.parametrize("version", VERSIONS)
def test_scaling_twice_would_be_caught(kitchen_run, version):
    """The classic bug (output multiplied by both scales again) fails these checks."""
    for case in kitchen_run(version, "grid")["cases"]:
        if "scaled_twice" in case:
            twice = case["scaled_twice"]
            assert twice["rel_mae"] > 0.5 and not 0.99 <= twice["norm_ratio"] <= 1.01


@pytest.mark.parametrize("version", VERSIONS)
def test_input_act_and_residual_options_of_each_release(kitchen_run, version):
    cases = by_name(kitchen_run(version, "grid"))
    expected_acts = {
        "0.2.11": set(), "0.2.19": set(), "0.2.22": set(), "0.2.23": {"gelu_tanh"},
        "0.2.26": {"gelu_tanh", "swiglu"}, "0.2.27": {"gelu_tanh", "swiglu"},
        "0.2.34": {"gelu_tanh", "swiglu", "rms_norm"},
        "0.2.36": {"gelu_tanh", "swiglu", "rms_norm"},
        "0.2.40": {"gelu_tanh", "swiglu", "rms_norm", "situ"},
    }[version]
    acts = {name[len("ck:act-"):] for name in cases if name.startswith("ck:act-")}
    assert acts == expected_acts
    assert ("ck:residual" in cases) == (version >= "0.2.34")
    for name in [n for n in cases if n.startswith("ck:act-")] + (["ck:residual"] if "ck:residual" in cases else []):
        assert_on_device(cases[name], served_by_shim=not upstream_first(version))
        assert_accurate(cases[name])


BAD = ("fp32-x", "k-mismatch", "empty-input", "scale-wrong-size", "bias-wrong-size", "cpu-weight",
       "1d-x", "k-over-65535", "unknown-keyword", "non-contiguous-x", "int-bias")


@pytest.mark.parametrize("version", VERSIONS)
def test_bad_inputs_never_give_a_wrong_number_or_a_cpu_fallback(kitchen_run, version):
    cases = by_name(kitchen_run(version, "bad", ASCEND_SHIM_INT8="shim"))
    assert set(BAD) <= set(cases)
    for name, case in cases.items():
        assert case["cpu_fallbacks"] == [], name
        assert "raised" not in case["validation"], (name, case["validation"])
        if "error" not in case and "cos" in case:
            assert case["cos"] >= 0.99995 and case["rel_mae"] <= 0.01, case
            assert case["finite"] is True, name
    # served on the device by the dequantized fallback, with the right result
    for name in ("fp32-x", "1d-x", "k-over-65535", "fallback-fp16-x-scale-1000"):
        assert "error" not in cases[name], cases[name]
        assert cases[name]["served_fallback"] == 1 and cases[name]["quant_matmul"] == 0, name
    assert cases["1d-x"]["shape"] == [64]
    # what eager refuses or answers its own way is eager's (test_parity.py): the shim
    # computes none of it; an int32 bias is refused at selection, as on the CPU
    for name in ("empty-input", "cpu-weight", "int-bias", "k-mismatch", "scale-wrong-size",
                 "bias-wrong-size"):
        assert cases[name]["served_fallback"] == 0 and cases[name]["quant_matmul"] == 0, name
    assert cases["int-bias"]["error"].startswith("NoCapableBackendError")
    assert "error" in cases["empty-input"]  # eager's torch.cat of no chunks
    # genuinely invalid: eager's own error, computed nowhere
    # (kitchen 0.2.11's eager checks neither K nor the scale: _int_mm's and torch's errors)
    assert cases["k-mismatch"]["error"].startswith(("ValueError: Input and weight inner dimensions",
                                                    "RuntimeError: _int_mm: self.size(1) needs to match"))
    assert cases["scale-wrong-size"]["error"].startswith(("ValueError: INT8 weight scale",
                                                          "RuntimeError: The size of tensor a (64)"))
    assert cases["bias-wrong-size"]["error"].startswith("RuntimeError: ")
    # accepted as they are: the INT8 path copes (a bias of N elements is eager's reshape(1, -1))
    for name in ("non-contiguous-x", "bf16-weight-scale", "bias-1-1-n"):
        assert_on_device(cases[name])
    assert cases["bias-1-1-n"]["shape"] == [9, 64]
    if version >= "0.2.23":  # call_rules: declined during selection, never raised
        for name in BAD:
            if name != "non-contiguous-x":
                assert cases[name]["validation"]["success"] is False, name
        assert cases["unknown-input-act"]["error"].startswith("ValueError: unsupported input_act")


@pytest.mark.parametrize("version", VERSIONS)
def test_unknown_options_go_to_eager_logged_once(kitchen_run, version):
    """A keyword newer than the shim: declined to eager (exact, on the device through
    the shim's _int_mm kernel), never a NotImplementedError; one warning per process."""
    cases = by_name(kitchen_run(version, "bad", ASCEND_SHIM_INT8="shim"))
    for name in ("unknown-keyword", "unknown-keyword-again"):
        case = cases[name]
        assert "error" not in case, case
        assert case["cos"] >= 0.99995 and case["cpu_fallbacks"] == [], case
        assert case["served_npu_quant"] == 0 and case["served_fallback"] == 0, case
        if version >= "0.2.23":  # both shim backends decline during selection
            assert case["validation"]["param"] == "future_option"
            assert case["backend"] == ("ascend" if upstream_first(version) else "eager")
        else:  # selected without rules: the shim hands the call to eager itself
            assert case["served_eager"] == 1 and case["quant_matmul"] == 0
    assert cases["unknown-keyword-again"]["unknown_warnings"] == 1


@pytest.mark.parametrize("version", VERSIONS)
def test_capability_is_probed_once_before_the_first_call(kitchen_run, version):
    """The first call pays for the probe (one small call of each op per output dtype and
    bias: 4 + 4 kernels), the user's own call is then the usual 2 kernels, and no call after
    that probes again."""
    result = kitchen_run(version, "bad", ASCEND_SHIM_INT8="shim")
    first, second = by_name(result)["first-call"], by_name(result)["second-call"]
    assert first["validation"]["kernels"] + first["dynamic_quant"] + first["quant_matmul"] == 4 + 4 + 2
    assert first["served_npu_quant"] == 1 and first["cpu_fallbacks"] == [] and first["cos"] >= 0.99995
    assert second["validation"]["kernels"] == 0
    assert_on_device(second)
    capability = result["report"]["capability"]
    assert capability["problem"] is None
    assert capability["combinations"] == {"float16": "ok", "float16+bias": "ok", "bfloat16": "ok",
                                          "bfloat16+bias": "ok"}


@pytest.mark.parametrize("version", ("0.2.22", "0.2.26", "0.2.40"))
def test_a_call_the_op_refuses_does_not_switch_the_npu_path_off(kitchen_run, version):
    """An op that refuses an input the contract accepted (here a lower K limit than
    documented) costs that call the fallback; the next call is on the NPU INT8 path again."""
    result = kitchen_run(version, "input_errors", ASCEND_SHIM_INT8="shim")
    cases = by_name(result)
    for name in ("k-128-refused-by-op", "k-128-again"):
        assert cases[name]["served_fallback"] == 1 and cases[name]["served_npu_quant"] == 0, cases[name]
        assert cases[name]["cos"] >= 0.99995 and cases[name]["cpu_fallbacks"] == []
    for name in ("k-64", "k-64-again"):
        assert cases[name]["served_npu_quant"] == 1 and cases[name]["quant_matmul"] == 1, cases[name]
        assert_accurate(cases[name])
    report = result["report"]
    assert report["quant_path"] == "ok" and report["npu_int8_served"] is True
    assert report["calls"]["quant_errors"] == 2


@pytest.mark.parametrize("suite", ("old_signature", "opaque_signature"))
@pytest.mark.parametrize("version", ("0.2.22", "0.2.26", "0.2.40"))
def test_an_npu_quant_matmul_without_pertoken_scale_never_raises(kitchen_run, suite, version):
    """op-plugin before per-token scaling: found from the signature when it is readable,
    else by the probe's TypeError; kitchen's list_backends() says why, and every call is
    served by the fallback on the device."""
    result = kitchen_run(version, suite, ASCEND_SHIM_INT8="shim")
    for case in result["cases"]:
        assert "error" not in case, case
        assert case["served_fallback"] == 1 and case["quant_matmul"] == 0, case
        assert case["cos"] >= 0.99995 and case["cpu_fallbacks"] == [], case
        assert case["backend"] == "ascend_shim_fallback" or version < "0.2.23", case
    shim = result["backends"]["ascend_shim"]
    assert "pertoken_scale" in shim["unavailable_reason"], shim
    if suite == "old_signature":  # known at registration: never registered
        assert shim["available"] is False
        assert result["report"]["registered"] == ["ascend_shim_fallback"]
    else:  # known after the probe: withdrawn
        assert shim["available"] is True and shim["disabled"] is True
    assert result["report"]["npu_int8_served"] is False


@pytest.mark.parametrize("version", VERSIONS)
def test_mm_int8_is_exact_on_the_device(kitchen_run, version):
    (case, floats) = kitchen_run(version, "mm_int8")["cases"]
    assert case["exact"] is True
    assert case["cpu_fallbacks"] == []
    assert case["shape"] == [33, 40] and case["dtype"] == "torch.int32"
    assert floats["error"].startswith("AssertionError"), floats


@pytest.mark.parametrize("version", ("0.2.11", "0.2.40"))
def test_mm_int8_refuses_float_operands_under_python_O(kitchen_run, version):
    """eager's asserts vanish under -O; the NPU path still refuses, never returns a number."""
    (_, floats) = kitchen_run(version, "mm_int8", flags=("-O",))["cases"]
    assert floats["optimize"] == 1
    assert "error" in floats and "shape" not in floats, floats


POLICIES = {
    # (release, ASCEND_SHIM_INT8): (head of the priority list, backend of the standard call);
    # under shim the fused RoPE backend comes first too (it offers no INT8 function)
    ("0.2.26", "auto"): (["ascend_shim", "ascend_shim_fallback"], "ascend_shim"),
    ("0.2.26", "shim"): (["ascend_shim_rope", "ascend_shim", "ascend_shim_fallback"], "ascend_shim"),
    ("0.2.26", "upstream"): (["ascend_shim_fallback"], "ascend_shim_fallback"),
    ("0.2.26", "off"): (["cuda", "triton", "eager"], "eager"),
    ("0.2.40", "auto"): (["ascend", "ascend_shim", "ascend_shim_fallback"], "ascend"),
    ("0.2.40", "shim"): (["ascend_shim_rope", "ascend_shim", "ascend_shim_fallback", "ascend"], "ascend_shim"),
    ("0.2.40", "upstream"): (["ascend", "ascend_shim_fallback"], "ascend"),
    ("0.2.40", "off"): (["ascend", "cuda", "triton", "eager"], "ascend"),
}


@pytest.mark.parametrize("version,policy", sorted(POLICIES))
def test_priority_policy(kitchen_run, version, policy):
    result = kitchen_run(version, "policy", ASCEND_SHIM_INT8=policy)
    head, backend = POLICIES[(version, policy)]
    assert result["priority"][:len(head)] == head
    cases = by_name(result)
    standard, fp32 = cases["standard"], cases["fp32-x"]
    assert standard["backend"] == backend
    if backend == "eager":
        # off registers no backend; eager's _int_mm still runs on the NPU (the int_mm patch
        # stays under every policy), and the answer is eager's own
        assert standard["cpu_fallbacks"] == [] and standard["cos"] >= 0.99995
        assert standard["dynamic_quant"] == 0 and standard["quant_matmul"] == 0
        return
    assert standard["cpu_fallbacks"] == []
    assert standard["cos"] >= 0.99995
    if backend in ("ascend", "ascend_shim"):
        assert standard["dynamic_quant"] == 1 and standard["quant_matmul"] == 1
    # what the NPU INT8 paths decline never reaches eager's _int_mm
    if policy != "off":
        assert fp32["backend"] == "ascend_shim_fallback" and fp32["cpu_fallbacks"] == []
        assert result["report"]["policy"] == policy
    if (version, policy) == ("0.2.40", "auto"):
        # upstream takes only fp32 scales: a bf16 scale falls to ascend_shim, on the NPU
        assert cases["bf16-scale"]["backend"] == "ascend_shim"
        assert cases["bf16-scale"]["served_npu_quant"] == 1
        assert cases["bf16-scale"]["cpu_fallbacks"] == []


@pytest.mark.parametrize("version", ("0.2.26", "0.2.40"))
def test_switched_off_the_int_mm_cpu_fallback_is_back(kitchen_run, version):
    """Proves the tests can see the bug the backend removes."""
    result = kitchen_run(version, "disabled", ASCEND_SHIM="0")
    case = by_name(result)["fp32-x" if version >= "0.2.36" else "standard"]
    assert case["backend"] == "eager"
    assert case["cpu_fallbacks"] == ["aten::_int_mm"]
    assert result["report"] is None  # the shim never loaded


def test_report_counts_calls(kitchen_run):
    result = kitchen_run("0.2.26", "bad", ASCEND_SHIM_INT8="shim")
    calls = result["report"]["calls"]
    served = sum(case.get("served_fallback", 0) for case in result["cases"])
    assert calls["npu_quant"] >= 2 and calls["fallback"] >= served >= 4
    assert {"x", "weight", "weight_scale", "bias"} <= set(calls["declined"])
    assert result["report"]["npu_int8_served"] is True
    json.dumps(result["report"])
