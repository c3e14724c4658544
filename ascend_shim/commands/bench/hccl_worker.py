"""One card's process of ``bench --hccl``: ``python -m ascend_shim.commands.bench.hccl_worker SPEC``.

Started by ``hccl`` once per card with ``ASCEND_RT_VISIBLE_DEVICES`` set to that card (so it
is ``npu:0`` here, as on a real box) and ``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``
set; joins the process group on torch.distributed's ``hccl`` backend (torch_npu's) and times the
Ulysses collectives on the sequence-parallel shapes in SPEC (JSON). Rank 0 prints one JSON line
with the medians; any failure is one line on stderr and exit status 1.
"""

import datetime
import json
import math
import os
import statistics
import sys
import time
from typing import Any, Callable, Dict


def _median_seconds(torch: Any, dist: Any, run: Callable[[], Any], warmup: int, repeat: int) -> float:
    for _ in range(warmup):
        run()
    torch.npu.synchronize()
    samples = []
    for _ in range(repeat):
        dist.barrier()  # every card starts together: the time is the collective's, not a late peer's
        torch.npu.synchronize()
        start = time.perf_counter()
        run()
        torch.npu.synchronize()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def measure(spec: Dict[str, Any]) -> Dict[str, Any]:
    import torch
    import torch.distributed as dist
    import torch_npu  # noqa: F401  (registers torch.npu and the hccl backend)

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    # this process sees one card (ASCEND_RT_VISIBLE_DEVICES): it is npu:0
    torch.npu.set_device(0)  # type: ignore[attr-defined]
    device = torch.device("npu", 0)
    dist.init_process_group("hccl", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=float(spec["timeout_s"])))
    try:
        shard = math.ceil(spec["tokens"] / world)  # Ulysses pads the sequence to a multiple of the cards
        # one of q, k, v (or the attention output): this card's tokens, every head, sent head-sharded
        elements = shard * spec["heads"] * spec["head_dim"]
        send = torch.ones(world, elements // world, dtype=torch.bfloat16, device=device)
        received = torch.empty_like(send)
        piece = torch.ones(shard, spec["hidden"], dtype=torch.bfloat16, device=device)
        gathered = torch.empty(world * shard, spec["hidden"], dtype=torch.bfloat16, device=device)
        times = {
            "all_to_all_s": _median_seconds(torch, dist, lambda: dist.all_to_all_single(received, send), spec["warmup"],
                                            spec["repeat"]),
            "all_gather_s": _median_seconds(torch, dist, lambda: dist.all_gather_into_tensor(gathered, piece),
                                            spec["warmup"], spec["repeat"]),
        }
        return dict(times, all_to_all_bytes_per_card=send.numel() * send.element_size(),
                    all_gather_bytes_out=gathered.numel() * gathered.element_size(), tokens_per_card=shard)
    finally:
        dist.destroy_process_group()


def main(argv: Any = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        result = measure(json.loads(argv[0]))
    except BaseException as exc:  # the parent reports this line for the card
        text = str(exc).strip().splitlines()
        sys.stderr.write("%s: %s\n" % (type(exc).__name__, text[0] if text else ""))
        return 1
    if os.environ.get("RANK") == "0":
        sys.stdout.write(json.dumps(result) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
