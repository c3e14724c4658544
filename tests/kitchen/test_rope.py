"""comfy-kitchen's RoPE family on the fused NPU ops (``ascend_shim_rope``), on the test bed.

Each (release, suite) runs ``rope_cases.py`` once in a fresh interpreter on
the simulated Ascend machine. The bad-input side (same errors as eager) is
``test_parity.py``'s grid, which covers the RoPE functions too.
"""

import pytest

import harness

CASES = harness.TESTS / "kitchen" / "rope_cases.py"
# 0.2.19: no call rules, no in-place variants; 0.2.27: in-place variants, no upstream ascend; 0.2.40: upstream ascend
VERSIONS = ("0.2.19", "0.2.27", "0.2.40")


@pytest.fixture(scope="session")
def rope_run(bed_python, tmp_path_factory):
    cache = {}

    def run(version, suite, **env):
        key = (version, suite, tuple(sorted(env.items())))
        if key not in cache:
            cwd = tmp_path_factory.mktemp("rope")
            proc = harness.run([str(bed_python), str(CASES), suite],
                               harness.bed_env("ascend-cu130", kitchen=version, **env), cwd, timeout=900)
            cache[key] = harness.last_json(proc)
        return cache[key]

    return run


@pytest.mark.parametrize("version", ("0.2.19", "0.2.27"))
def test_model_shapes_run_fused_and_equal_eager_within_one_rounding(rope_run, version):
    # ASCEND_SHIM_INT8=shim: the shim first, so 0.2.40 would test the same path; here
    # the releases without an NPU RoPE of their own
    result = rope_run(version, "numerics")
    assert result["cases"], result
    for case in result["cases"]:
        assert case["devices"] == ["npu"] and case["cpu_fallbacks"] == [], case
        assert case["fused"] == 1 and case["rotary_mul"] >= 1, case
        if case["name"].startswith(("lumina", "minimax", "rms")):
            assert case["rms_norm"] >= 1, case
        # fp32 results that differ by fp32 rounding land at most one output ulp apart
        assert case["max_units"] <= 2.0, case
        assert case["cos"] >= 0.999999, case
    names = {c["name"] for c in result["cases"]}
    assert len(names) >= 14
    if version != "0.2.19":  # rot_dim and the in-place variants
        assert "minimax rms_rope_split_half rot_dim bfloat16 in place" in names


def test_coefficients_are_built_once_per_freqs_tensor_and_never_stale(rope_run):
    result = rope_run("0.2.27", "cache")
    # two layouts of one freqs_cis, ten calls each
    assert result["ten_calls"] == {"built": 2, "reused": 18, "entries": 2}
    changed = result["changed_in_place"]
    assert changed["built"] == 3 and changed["max_units"] <= 2.0, changed
    assert result["freed"] == {"entries_before": 2, "entries_after": 0}
    assert result["new_tensors_wrong"] == 0
    inference = result["inference"]  # no version counter: used, never cached
    assert inference["entries_added"] == 0 and inference["built"] == 2, inference
    assert inference["first"] <= 2.0 and inference["after_change"] <= 2.0, inference


def test_a_prompts_call_builds_once_for_q_and_k_and_writes_into_the_qkv_buffer(rope_run):
    pair = rope_run("0.2.27", "cache")["in_place_pair"]
    assert pair["built"] == 1, pair  # inference tensors: never cached, so once per call, not per tensor
    ops = {name.split("::")[-1]: n for name, n in pair["ops"].items()}
    assert "cat" not in ops, ops  # the rotated half and the rest are copied into q and k directly
    # per tensor: contiguous input, the slice for npu_rotary_mul, two copies back; the build's copy + mul
    assert ops.get("copy_", 0) == 2 * 2 + 1 and ops.get("mul", 0) == 1, ops
    assert pair["max_units"] <= 2.0 and pair["cos"] >= 0.999999, pair


def test_a_coefficient_build_is_two_device_kernels(rope_run):
    from testbed.device_work import ALLOCATION_OPS, VIEW_OPS, bare

    for layout, ops in rope_run("0.2.27", "cache")["build_ops"].items():
        work = {bare(name): n for name, n in ops.items() if bare(name) not in VIEW_OPS | ALLOCATION_OPS}
        assert work == {"copy_": 1, "mul": 1}, (layout, ops)  # the diagonal copied, the anti-diagonal signed


def test_a_refusal_after_the_norm_leaves_the_inputs_for_eager(rope_run):
    refused = rope_run("0.2.27", "cache")["refused_in_place"]
    assert refused["to_eager"] == 1, refused
    assert refused["max_units"] <= 2.0 and refused["cos"] >= 0.999999, refused


@pytest.mark.parametrize("version", ("0.2.19", "0.2.27"))
def test_calls_outside_the_ops_limits_go_to_eager_on_the_device(rope_run, version):
    result = rope_run(version, "declined")
    assert len(result["cases"]) == 4
    for case in result["cases"]:
        assert case["device"] == "npu" and case["cpu_fallbacks"] == [], case
        assert case["fused"] == 0 and case["rotary_mul"] == 0 and case["declined"] == 1, case
        assert case["max_abs"] == 0.0, case


def test_a_wrong_npu_rotary_mul_is_caught_by_the_probe(rope_run):
    result = rope_run("0.2.27", "wrong_op")
    assert result["max_abs"] == 0.0
    assert "probe returned a wrong result" in result["report"]["probes"]["npu:0"]
    assert not result["report"]["calls"]["fused"]


@pytest.mark.parametrize("version,policy,order,bf16,fp32", [
    ("0.2.27", "auto", ["ascend_shim_rope", "eager"], "ascend_shim_rope", "ascend_shim_rope"),
    ("0.2.27", "upstream", ["eager"], "eager", "eager"),
    ("0.2.40", "auto", ["ascend", "ascend_shim_rope", "eager"], "ascend", "ascend_shim_rope"),
    ("0.2.40", "shim", ["ascend_shim_rope", "ascend", "eager"], "ascend_shim_rope", "ascend_shim_rope"),
    ("0.2.36", "auto", ["ascend", "ascend_shim_rope", "eager"], "ascend", "ascend_shim_rope"),
    ("0.2.40", "off", ["ascend", "eager"], "ascend", "eager"),
])
def test_coexistence_with_upstream_ascend(rope_run, version, policy, order, bf16, fp32):
    result = rope_run(version, "registration", ASCEND_SHIM_INT8=policy)
    relevant = [n for n in result["priority"] if n in ("ascend", "ascend_shim_rope", "eager")]
    assert relevant == order, result["priority"]
    assert result["serving"] == {"apply_rope1 bfloat16": bf16, "apply_rope1 float32": fp32}


# -- in process, on the CPU: the pure math and the cache -------------------------------

def _rotation_freqs(positions, pairs):
    torch = pytest.importorskip("torch")
    angle = torch.rand(positions, pairs) * 10
    m = torch.stack([angle.cos(), -angle.sin(), angle.sin(), angle.cos()], -1)
    return m.reshape(1, 1, positions, pairs, 2, 2)


@pytest.mark.parametrize("split", (False, True))
def test_the_coefficients_hold_freqs_cis_numbers_in_the_rotary_mul_layout(split):
    torch = pytest.importorskip("torch")
    from ascend_shim.npu_math import rope as rope_math

    freqs = torch.randn(1, 1, 3, 4, 2, 2, dtype=torch.float64)  # any 2x2 matrices, not only rotations
    x = torch.randn(1, 2, 3, 8, dtype=torch.float64)
    r1, r2 = rope_math.rotary_coefficients(freqs, split)
    got = rope_math.rotate_reference(x, r1, r2, split)
    # the pair (a, b) -> (M00 a + M01 b, M10 a + M11 b), pairs as each layout places them
    if split:
        a, b = x[..., :4], x[..., 4:]
    else:
        a, b = x[..., 0::2], x[..., 1::2]
    first = freqs[..., 0, 0] * a + freqs[..., 0, 1] * b
    second = freqs[..., 1, 0] * a + freqs[..., 1, 1] * b
    want = torch.cat((first, second), -1) if split else torch.stack((first, second), -1).flatten(-2)
    assert torch.allclose(got, want, rtol=1e-12, atol=1e-12)
    # exact: the coefficients are the numbers of freqs_cis, negated or not
    assert set(r1.flatten().tolist()) <= set(freqs.flatten().tolist())


def test_the_cache_builds_once_rebuilds_on_change_and_forgets_freed_tensors():
    torch = pytest.importorskip("torch")
    import gc

    from ascend_shim.kitchen import rope

    cache = rope.CoefficientCache(size=4)
    freqs = _rotation_freqs(5, 4)
    first = cache.get(freqs, False)
    assert cache.get(freqs, False) is first and len(cache) == 1
    freqs.mul_(-1)  # in place: the version counter moves
    rebuilt = cache.get(freqs, False)
    assert rebuilt is not first and torch.equal(rebuilt[0], -first[0])
    del freqs
    gc.collect()
    assert len(cache) == 0
    for _ in range(6):  # bounded
        cache.get(_rotation_freqs(5, 4), True)
    kept = [_rotation_freqs(5, 4) for _ in range(6)]
    for f in kept:
        cache.get(f, True)
    assert len(cache) == 4
    with torch.inference_mode():
        inference = _rotation_freqs(5, 4)
        a = cache.get(inference, False)
        inference.mul_(-1)  # no version counter: never served from the cache
        assert torch.equal(cache.get(inference, False)[0], -a[0])
    assert len(cache) == 4


def test_status_shows_what_the_fused_rope_served_and_left_to_eager():
    pytest.importorskip("torch")
    from ascend_shim.commands.status import sections as reports
    from ascend_shim.kitchen import rope

    rope.COUNTERS.reset()
    try:
        rope.COUNTERS.fused["rms_rope_split_half"] += 3
        rope.COUNTERS.to_eager["apply_rope"] += 1
        rope.COUNTERS.decline("head_dim 1024 is not below 896")
        report = dict(rope.report(), registered=True)
        lines = reports.rope_lines(report)
        assert lines[0] == "  RoPE calls: fused on the NPU 3, handed to kitchen's eager 1"
        assert "    RoPE to eager, 1: head_dim 1024 is not below 896" in lines
        assert reports.rope_lines(dict(report, registered=False)) == []  # nothing registered, nothing said
        assert reports.rope_lines(None) == []
    finally:
        rope.COUNTERS.reset()


def test_uninstalling_takes_the_backend_out_and_its_report_says_so():
    pytest.importorskip("torch")
    from ascend_shim.kitchen import rope

    class Registry:  # the one call uninstall makes of registry_access.KitchenRegistry
        def __init__(self):
            self.removed = []

        def unregister(self, name):
            self.removed.append(name)

    saved = rope._state["backend"]
    try:
        rope._state["backend"] = rope.RopeBackend(None, None, False, None, False)
        assert rope.report()["registered"] is True
        registry = Registry()
        rope.uninstall(registry)
        rope.uninstall(registry)  # idempotent
        assert registry.removed == [rope.BACKEND, rope.BACKEND] and rope.report()["registered"] is False
    finally:
        rope._state["backend"] = saved
