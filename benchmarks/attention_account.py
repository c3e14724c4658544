"""Host cost of the attention account per SDPA call, on the simulated Ascend device.

One interpreter with the bed's fake torch_npu (its SDPA kernel counts fused vs
math path, computing on the CPU). The account's wrapper is applied as the
patch applies it (wrapt, via ``patches.shared.wraps``) to a stand-in for
``comfy.ops`` holding torch's SDPA, and timed against the same call unwrapped:

  account adds   the wrapper around a no-op, less the same no-op unwrapped: what
                 the account (and its wrapt wrapper) adds per call
  wrapped SDPA   the wrapped call on small bed NPU tensors (1, 4, 16, 64) bf16
  plain SDPA     the same call, unwrapped

per mask kind: none, bool, a float mask the cache already said "no" to (CLIP's
-finfo.max), a float 0/-inf mask (cached "yes", normal tensor), and the same
made under inference mode (no version counter: re-checked, one host sync,
each call). Median of --rounds medians of --repeat calls (SDPA: --repeat/10), contenders
taking turns within each round.

    python benchmarks/attention_account.py [--repeat 2000] [--rounds 5]
"""

import argparse
import statistics
import sys
import time
import types
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests"), str(ROOT / "tests" / "testbed" / "fake_torch_npu")]

import torch  # noqa: E402
import torch_npu  # noqa: E402,F401  (the bed's: installs the simulated npu device)

from ascend_shim.engine.patching import Changes  # noqa: E402
from ascend_shim.patches.comfyui.reports import attention_account as account  # noqa: E402
from ascend_shim.patches.shared.wraps import wrap_function  # noqa: E402


def per_call_us(contenders, repeat, rounds):
    """Median µs per call of each function; the contenders take turns within every round."""
    for function in contenders:
        for _ in range(min(repeat, 50)):
            function()
    medians = [[] for _ in contenders]
    for _ in range(rounds):
        for i, function in enumerate(contenders):
            times = []
            for _ in range(repeat):
                start = time.perf_counter()
                function()
                times.append(time.perf_counter() - start)
            medians[i].append(statistics.median(times))
    return [statistics.median(m) * 1e6 for m in medians]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=5)
    options = parser.parse_args()
    torch.set_num_threads(1)

    plain = torch.nn.functional.scaled_dot_product_attention
    ops = types.SimpleNamespace(scaled_dot_product_attention=plain)
    bare = types.SimpleNamespace(scaled_dot_product_attention=lambda q, k, v, *a, **kw: None)
    noop = types.SimpleNamespace(scaled_dot_product_attention=bare.scaled_dot_product_attention)
    changes = Changes()
    wrap_function(changes, ops, "scaled_dot_product_attention", account._account)
    wrap_function(changes, noop, "scaled_dot_product_attention", account._account)

    q, k, v = (torch.randn(1, 4, 16, 64).to(torch.bfloat16).to("npu") for _ in range(3))
    padding = torch.zeros(1, 1, 16, 16, dtype=torch.bfloat16)
    padding[..., 12:] = float("-inf")
    with torch.inference_mode():
        inference_mask = padding.to("npu")
    masks = {
        "none": None,
        "bool": (padding == 0).to("npu"),
        "float, not exact (cached no)": padding.clamp(min=-torch.finfo(torch.bfloat16).max).to("npu"),
        "float 0/-inf (cached yes)": padding.to("npu"),
        "float 0/-inf, inference tensor (sync each call)": inference_mask,
    }
    print("| mask | account adds µs | wrapped SDPA µs | plain SDPA µs | ratio wrapped/plain |")
    print("|---|---:|---:|---:|---:|")
    for name, mask in masks.items():
        def inference(fn):
            def run():
                with torch.inference_mode():
                    fn()
            return run

        only = inference(lambda: noop.scaled_dot_product_attention(q, k, v, attn_mask=mask))
        baseline = inference(lambda: bare.scaled_dot_product_attention(q, k, v, attn_mask=mask))
        wrapped = inference(lambda: ops.scaled_dot_product_attention(q, k, v, attn_mask=mask))
        unwrapped = inference(lambda: plain(q, k, v, attn_mask=mask))
        t_only, t_baseline = per_call_us([only, baseline], options.repeat, options.rounds)
        t_only -= t_baseline
        t_wrapped, t_plain = per_call_us([wrapped, unwrapped], options.repeat // 10 or 1, options.rounds)
        print("| %s | %.1f | %.1f | %.1f | %.3f |" % (name, t_only, t_wrapped, t_plain, t_wrapped / t_plain))
    print("account:", account.report()["by_reason"])
    print("bed paths:", dict(torch_npu._testbed.sdpa_paths))
    changes.undo()


if __name__ == "__main__":
    main()
