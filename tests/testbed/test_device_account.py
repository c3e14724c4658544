"""The device account (tests/testbed/device_account.py): kernels, bytes and FLOPs of a few known ops.

Run in a child interpreter on the simulated Ascend machine (the account wraps the bed's
dispatch and the fake torch_npu's call record).
"""

import json
import sys
import tempfile
import textwrap

import harness

SCRIPT = textwrap.dedent("""
    import json
    import torch
    import torch_npu
    from testbed import device_account

    account = device_account.Account().install()
    a = torch.ones(64, 32, dtype=torch.bfloat16, device="npu")
    b = torch.ones(32, 16, dtype=torch.bfloat16, device="npu")
    row = torch.ones(1, 32, dtype=torch.bfloat16, device="npu")
    gamma = torch.ones(32, dtype=torch.bfloat16, device="npu")
    account.start()
    a.t()                                   # a view: no kernel
    torch.mm(a, b)                          # 64x32 @ 32x16
    a + row.expand(64, 32)                  # a broadcast input is read once
    torch_npu.npu_rms_norm(a, gamma, 1e-6)  # a torch_npu op: one kernel, its results written
    rows = account.stop()
    a + a                                   # after stop: not counted
    print(json.dumps(rows))
""")


def test_the_account_charges_each_kernel_its_bytes_and_flops():
    with tempfile.TemporaryDirectory() as tmp:
        proc = harness.run([sys.executable, "-c", SCRIPT],
                           harness.bed_env("ascend-cu130", extra_path=(str(harness.TESTS),), OMP_NUM_THREADS="1"),
                           tmp, check=True)
    rows = {op: (kernels, moved, flops, int8) for _, op, kernels, moved, flops, int8 in json.loads(proc.stdout)}
    bf16 = 2
    assert rows["mm"] == (1, (64 * 32 + 32 * 16 + 64 * 16) * bf16, 2.0 * 64 * 32 * 16, 0.0), rows
    assert rows["add"] == (1, (64 * 32 + 32 + 64 * 32) * bf16, 64.0 * 32, 0.0), rows
    # x and gamma read; y (bf16) and the reverse rms (fp32, one per row) written
    assert rows["npu_rms_norm"][:2] == (1, (64 * 32 + 32 + 64 * 32) * bf16 + 64 * 4), rows
    assert set(rows) == {"mm", "add", "npu_rms_norm"}, rows  # no view, nothing after stop
