"""The simulated HCCL (testbed/hccl.py): torch.distributed across processes, one simulated card each.

Each scenario starts its ranks as separate interpreters on the users' box (``ascend-cu130``,
``harness.bed_env``), every one with ``TESTBED_NPU_COUNT`` the box's cards and
``ASCEND_RT_VISIBLE_DEVICES`` its own card, as Ray sets it per actor, and a file store for the
rendezvous. Four ranks run every collective of ProcessGroupHCCL once against a CPU computation
of the same values, the refusals and the byte counts; two ranks run the ``"cpu:gloo,npu:hccl"``
form, ``init_device_mesh("npu")`` and the collectives C++ issues itself (functional
collectives, DTensor), each keeping the journal of what it issued; two ranks on one card are
refused at their first collective. Each child prints one JSON line; a rank that fails or hangs
fails its scenario.
"""

import json
import re
import subprocess
import sys
import textwrap

import pytest

import harness

TIMEOUT = 120  # seconds for a whole scenario; a rank blocks at most 60 s in torch (init timeout)

CHILD = r'''
import json, os, sys, warnings
from datetime import timedelta
import torch, torch_npu
import torch.distributed as dist
from testbed import hccl

mode = sys.argv[1]
rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
out = {"results": {}, "errors": {}, "bytes": {}, "pid": os.getpid()}


def init(backend):
    dist.init_process_group(backend, init_method="file://" + os.environ["HCCL_TEST_STORE"], rank=rank,
                            world_size=world, timeout=timedelta(seconds=60))


def data(r, n=8, dtype=torch.float32):
    """Rank r's input: n values, distinct per rank."""
    return (torch.arange(n, dtype=torch.float32) + 10 * r).to(dtype)


def cpu(t):
    return t.to("cpu") if isinstance(t, torch.Tensor) else t


def check(name, run, want):
    """Run one collective; keep what it produced, the CPU answer and what the bed counted."""
    hccl.reset_collective_bytes()
    got = run()
    out["bytes"][name] = ["%d/%s/%d/%d/%d" % (card, kind, v["calls"], v["sent"], v["received"])
                          for (card, kind), v in sorted(hccl.collective_bytes().items())]
    if want is not None:
        got = [cpu(g).tolist() for g in got] if isinstance(got, list) else cpu(got).tolist()
        want = [w.tolist() for w in want] if isinstance(want, list) else want.tolist()
        out["results"][name] = [got, want]


def refused(name, run):
    try:
        run()
    except Exception as e:  # noqa: BLE001 - the message is the point
        out["errors"][name] = "%s: %s" % (type(e).__name__, str(e).split("\n")[0])
        out.setdefault("messages", {})[name] = str(e)
    else:
        out["errors"][name] = None


if mode == "world":
    torch.npu.set_device(0)
    init("hccl")
    P = world
    out["backend"] = dist.get_backend()
    out["registered"] = [dist.is_hccl_available(), dist.Backend.default_device_backend_map.get("npu")]

    def all_reduce():
        x = data(rank).npu()
        dist.all_reduce(x)
        return x
    check("all_reduce", all_reduce, sum(data(r) for r in range(P)))

    def all_reduce_max():
        x = data(rank, dtype=torch.int32).npu()
        dist.all_reduce(x, op=dist.ReduceOp.MAX)
        return x
    check("all_reduce_max_int32", all_reduce_max, data(P - 1, dtype=torch.int32))

    def all_reduce_avg():
        x = data(rank, dtype=torch.bfloat16).npu()
        dist.all_reduce(x, op=dist.ReduceOp.AVG, async_op=True).wait()
        return x
    check("all_reduce_avg_bf16", all_reduce_avg, sum(data(r) for r in range(P)) / P)

    def all_reduce_bool():
        x = (data(rank) % P == rank).npu()
        dist.all_reduce(x)
        return x
    check("all_reduce_bool", all_reduce_bool, torch.stack([data(r) % P == r for r in range(P)]).any(0))

    def broadcast():
        x = data(rank, dtype=torch.int64).npu()
        dist.broadcast(x, src=1)
        return x
    check("broadcast", broadcast, data(1, dtype=torch.int64))

    def all_gather():
        outs = [torch.empty(8, dtype=torch.float16, device="npu") for _ in range(P)]
        dist.all_gather(outs, data(rank, dtype=torch.float16).npu())
        return outs
    check("all_gather", all_gather, [data(r, dtype=torch.float16) for r in range(P)])

    def all_gather_into_tensor():
        o = torch.empty(P * 8, device="npu")
        dist.all_gather_into_tensor(o, data(rank).npu(), async_op=True).wait()
        return o
    check("all_gather_into_tensor", all_gather_into_tensor, torch.cat([data(r) for r in range(P)]))

    def reduce_scatter():
        o = torch.empty(8, device="npu")
        dist.reduce_scatter(o, [data(rank + j).npu() for j in range(P)])
        return o
    check("reduce_scatter", reduce_scatter, sum(data(r + rank) for r in range(P)))

    def reduce_scatter_tensor():
        o = torch.empty(8, dtype=torch.int16, device="npu")
        dist.reduce_scatter_tensor(o, data(rank, n=8 * P, dtype=torch.int16).npu())
        return o
    check("reduce_scatter_tensor_int16", reduce_scatter_tensor,
          sum(data(r, n=8 * P, dtype=torch.int16) for r in range(P)).reshape(P, 8)[rank])

    def all_to_all_single():
        o = torch.empty(2 * P, 3, device="npu")
        dist.all_to_all_single(o, data(rank, n=6 * P).reshape(2 * P, 3).npu())
        return o
    check("all_to_all_single", all_to_all_single,
          torch.cat([data(r, n=6 * P).reshape(2 * P, 3)[2 * rank:2 * rank + 2] for r in range(P)]))

    # uneven: rank r sends j + 1 rows to rank j, so every rank receives rank + 1 rows from each
    rows = P * (P + 1) // 2
    start = rank * (rank + 1) // 2

    def all_to_all_splits():
        o = torch.empty(P * (rank + 1), 3, device="npu")
        dist.all_to_all_single(o, data(rank, n=3 * rows).reshape(rows, 3).npu(),
                               output_split_sizes=[rank + 1] * P, input_split_sizes=[j + 1 for j in range(P)])
        return o
    check("all_to_all_single_splits", all_to_all_splits,
          torch.cat([data(r, n=3 * rows).reshape(rows, 3)[start:start + rank + 1] for r in range(P)]))

    def all_to_all():
        outs = [torch.empty(2, device="npu") for _ in range(P)]
        dist.all_to_all(outs, [data(rank, n=2 * P)[2 * j:2 * j + 2].npu() for j in range(P)])
        return outs
    check("all_to_all", all_to_all, [data(r, n=2 * P)[2 * rank:2 * rank + 2] for r in range(P)])

    check("barrier", lambda: dist.barrier(), None)

    def send_recv():
        got = torch.empty(3, device="npu")
        ops = [dist.P2POp(dist.isend, data(rank, n=3).npu(), (rank + 1) % P),
               dist.P2POp(dist.irecv, got, (rank - 1) % P)]
        for work in dist.batch_isend_irecv(ops):
            work.wait()
        return got
    check("send_recv", send_recv, data((rank - 1) % P, n=3))

    def scatter():
        o = torch.empty(8, device="npu")
        dist.scatter(o, [data(j).npu() for j in range(P)] if rank == 0 else None, src=0)
        return o
    check("scatter", scatter, data(rank))

    def reduce():
        x = data(rank).npu()
        dist.reduce(x, dst=2)
        return x if rank == 2 else torch.zeros(0)
    check("reduce", reduce, sum(data(r) for r in range(P)) if rank == 2 else torch.zeros(0))

    def gather():
        outs = [torch.empty(8, device="npu") for _ in range(P)] if rank == 0 else None
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            dist.gather(data(rank).npu(), outs, dst=0)
        out["gather_warning"] = [str(w.message) for w in seen if "gather" in str(w.message)]
        return outs if rank == 0 else []
    check("gather", gather, [data(r) for r in range(P)] if rank == 0 else [])

    sub = dist.new_group([0, 2], backend="hccl")
    if rank in (0, 2):
        def subgroup():
            x = data(rank).npu()
            dist.all_reduce(x, group=sub)
            return x
        check("subgroup", subgroup, data(0) + data(2))
    else:
        out["subgroup_member"] = sub is not dist.GroupMember.NON_GROUP_MEMBER

    refused("cpu_tensor", lambda: dist.all_reduce(torch.ones(2)))
    refused("float64", lambda: dist.all_reduce(torch.ones(2, dtype=torch.float64, device="npu")))
    refused("band", lambda: dist.all_reduce(torch.ones(2, dtype=torch.int32, device="npu"), op=dist.ReduceOp.BAND))
    refused("cpu_outputs", lambda: dist.all_gather([torch.empty(2) for _ in range(P)], torch.ones(2, device="npu")))
    refused("gather_backend", lambda: dist.group.WORLD.gather(
        [[torch.empty(2, device="npu") for _ in range(P)]] if rank == 0 else [], [torch.ones(2, device="npu")],
        torch._C._distributed_c10d.GatherOptions()))
    refused("recv_any_source", lambda: dist.recv(torch.empty(2, device="npu")))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        refused("all_gather_coalesced", lambda: dist.all_gather_coalesced(
            [[torch.empty(2, device="npu")] for _ in range(P)], [torch.ones(2, device="npu")]))
    dist.barrier()
    dist.destroy_process_group()

elif mode == "mixed":
    init("cpu:gloo,npu:hccl")
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Shard
    import torch.distributed._functional_collectives as fc

    mesh = init_device_mesh("npu", (world,))
    out["mesh"] = [mesh.device_type, mesh.size(), torch.npu.current_device()]
    out["backends"] = [dist.get_backend(), dist.group.WORLD._get_backend(torch.device("cpu")).name()]
    c = data(rank)
    hccl.reset_collective_bytes()
    dist.all_reduce(c)  # a CPU tensor goes to gloo, outside HCCL
    out["cpu_all_reduce"] = [c.tolist(), sum(data(r) for r in range(world)).tolist(), hccl.collective_bytes()]
    check("functional_all_reduce", lambda: fc.all_reduce(data(rank).npu(), "sum", mesh),
          sum(data(r) for r in range(world)))
    d = DTensor.from_local(data(rank).reshape(2, 4).npu(), mesh, [Shard(0)])
    check("dtensor_full_tensor", lambda: d.full_tensor(), torch.cat([data(r) for r in range(world)]).reshape(-1, 4))
    dist.destroy_process_group()

elif mode == "same_card":
    init("hccl")
    out["init"] = "ok"
    refused("first_collective", lambda: dist.all_reduce(torch.ones(2, device="npu")))

print(json.dumps(out))
'''


def _scenario(tmp_path, mode, cards, box, **extra):
    """Start one interpreter per rank (rank r on ``cards[r]`` of a ``box``-card machine); their JSON."""
    script = tmp_path / "rank.py"
    script.write_text(textwrap.dedent(CHILD))
    procs = []
    for rank, card in enumerate(cards):
        env = harness.bed_env("ascend-cu130", TESTBED_NPU_COUNT=box, ASCEND_RT_VISIBLE_DEVICES=card,
                              RANK=rank, WORLD_SIZE=len(cards), HCCL_TEST_STORE=tmp_path / "store", **extra)
        procs.append(subprocess.Popen([sys.executable, str(script), mode], env=env, cwd=str(tmp_path),
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    return harness.ranks_json(procs, TIMEOUT)


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    return _scenario(tmp_path_factory.mktemp("world"), "world", cards=[0, 1, 2, 3], box=4)


def test_every_collective_matches_a_cpu_computation(world):
    names = {"all_reduce", "all_reduce_max_int32", "all_reduce_avg_bf16", "all_reduce_bool", "broadcast",
             "all_gather", "all_gather_into_tensor", "reduce_scatter", "reduce_scatter_tensor_int16",
             "all_to_all_single", "all_to_all_single_splits", "all_to_all", "send_recv", "scatter", "reduce",
             "gather"}
    for rank, child in enumerate(world):
        assert child["backend"] == "hccl" and child["registered"] == [True, "hccl"]
        expected = names | ({"subgroup"} if rank in (0, 2) else set())
        assert set(child["results"]) == expected
        for name, (got, want) in child["results"].items():
            assert got == want, (rank, name)
    assert [child.get("subgroup_member") for child in world] == [None, False, None, False]
    # torch_npu's dist.gather runs an all_gather and says so on dst
    assert world[0]["gather_warning"] == [
        "HCCL doesn't support gather at the moment. Implemented with allgather instead."]
    assert all(not child["gather_warning"] for child in world[1:])


def test_refusals_use_torch_npu_wording(world):
    for child in world:
        errors = child["errors"]
        assert errors["cpu_tensor"] == "RuntimeError: No backend type associated with device type cpu"
        assert errors["float64"] == "RuntimeError: HCCL allreduce: Unsupported data type at::kDouble"
        assert errors["band"] == "RuntimeError: Cannot use ReduceOp.BAND with HCCL"
        assert errors["cpu_outputs"] == "RuntimeError: Tensors must be NPU and dense"
        assert errors["gather_backend"] == "RuntimeError: ProcessGroupHCCL does not support gather"
        assert errors["recv_any_source"] == "RuntimeError: ProcessGroupHCCL does not support recv"
        assert errors["all_gather_coalesced"] == "RuntimeError: Backend hccl does not support allgather_coalesced"
    # torch_npu's DIST_ERROR suffix: the rank's card (the current device) and RANK
    for rank, child in enumerate(world):
        assert re.fullmatch(r"HCCL allreduce: Unsupported data type at::kDouble\n"
                            r"\[ERROR\] \d{4}-\d\d-\d\d-\d\d:\d\d:\d\d "
                            r"\(PID:\d+, Device:0, RankID:%d\) ERR02007 DIST feature not supported" % rank,
                            child["messages"]["float64"])


def _payload(name, rank, p=4):
    """The logical bytes (sent, received) testbed/hccl.py's docstring defines, per op of the world run."""
    ring = lambda s: (2 * (p - 1) * s // p,) * 2  # noqa: E731
    share = lambda s: ((p - 1) * s // p,) * 2  # noqa: E731
    rows = p * (p + 1) // 2
    return {
        "all_reduce": ("all_reduce",) + ring(32),
        "all_reduce_max_int32": ("all_reduce",) + ring(32),
        "all_reduce_avg_bf16": ("all_reduce",) + ring(16),
        "all_reduce_bool": ("all_reduce",) + ring(8),
        "broadcast": ("broadcast", 64, 0) if rank == 1 else ("broadcast", 0, 64),
        "all_gather": ("all_gather",) + share(p * 16),
        "all_gather_into_tensor": ("all_gather_into_tensor",) + share(p * 32),
        "reduce_scatter": ("reduce_scatter",) + share(p * 32),
        "reduce_scatter_tensor_int16": ("reduce_scatter_tensor",) + share(p * 16),
        "all_to_all_single": ("all_to_all_single",) + share(p * 24),
        "all_to_all_single_splits": ("all_to_all_single", (rows - rank - 1) * 12, (p - 1) * (rank + 1) * 12),
        "all_to_all": ("all_to_all",) + share(p * 8),
        "barrier": ("barrier",) + ring(4),
        "scatter": ("scatter", (p - 1) * 32, 0) if rank == 0 else ("scatter", 0, 32),
        "reduce": ("reduce", 0, 32) if rank == 2 else ("reduce", 32, 0),
        "subgroup": ("all_reduce",) + (32, 32),
    }.get(name)


def test_bytes_are_the_logical_payload_per_card(world):
    for rank, child in enumerate(world):
        for name, entries in child["bytes"].items():
            want = _payload(name, rank)
            if want is None:
                continue
            kind, sent, received = want
            assert entries == ["%d/%s/1/%d/%d" % (rank, kind, sent, received)], (rank, name)
        # one ring step: a send and a recv of 12 bytes, on this rank's own card
        assert child["bytes"]["send_recv"] == ["%d/recv/1/0/12" % rank, "%d/send/1/12/0" % rank]
        # dist.gather is torch_npu's: the sizes broadcast from dst, then an all_gather; no gather op
        kinds = {entry.split("/")[1] for entry in child["bytes"]["gather"]}
        assert kinds == {"broadcast", "all_gather"}


@pytest.fixture(scope="module")
def mixed(tmp_path_factory):
    """Two ranks on cards 2 and 5 of an 8-card box, each keeping its journal (hccl.py's Journal)."""
    folder = tmp_path_factory.mktemp("mixed")
    ranks = _scenario(folder, "mixed", cards=[2, 5], box=8, TESTBED_HCCL_JOURNAL=folder / "journal")
    for child in ranks:
        path = folder / "journal" / ("hccl-%d.jsonl" % child["pid"])
        child["journal"] = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else None
    return ranks


def test_cpu_gloo_npu_hccl_and_a_device_mesh(mixed):
    for rank, child in enumerate(mixed):
        assert child["mesh"] == ["npu", 2, 0]
        assert child["backends"] == ["cpu:gloo,npu:hccl", "gloo"]
        got, want, counted = child["cpu_all_reduce"]
        assert got == want and counted == {}  # gloo's, not HCCL's
        for name, (got, want) in child["results"].items():
            assert got == want, (rank, name)
        assert set(child["results"]) == {"functional_all_reduce", "dtensor_full_tensor"}
        # issued from C++ (functional collectives) yet counted on this rank's physical card
        card = [2, 5][rank]
        assert child["bytes"]["functional_all_reduce"] == ["%d/all_reduce/1/32/32" % card]  # 2(P-1)/P x 32 bytes, P = 2
        assert [entry.split("/")[0] for entry in child["bytes"]["dtensor_full_tensor"]] == [str(card)]


def test_the_journal_keeps_each_collective_a_process_issued_on_its_card(mixed):
    """One line per HCCL collective, in the process's own file, on its physical card; gloo's none."""
    for card, child in zip([2, 5], mixed):
        journal = child["journal"]
        assert journal, child
        assert {(line["pid"], line["card"]) for line in journal} == {(child["pid"], card)}
        # the functional all_reduce, then DTensor's gather; the CPU all_reduce before them is gloo's
        assert [line["kind"] for line in journal] == ["all_reduce", "all_gather_into_tensor_coalesced"], journal


def test_two_ranks_on_one_card_are_refused_at_the_first_collective(tmp_path):
    ranks = _scenario(tmp_path, "same_card", cards=[1, 1], box=2)
    for child in ranks:
        assert child["init"] == "ok"  # the communicator is made lazily, as in ProcessGroupHCCL
        assert child["errors"]["first_collective"].startswith(
            "RuntimeError: create_config:torch_npu/csrc/distributed/HCCLUtils.cpp:140 HCCL function error: "
            "hcclCommInitRootInfoConfig(numRanks, &rootInfo, rank, config, &(comm->hcclComm_)), error code is 7")
        message = child["messages"]["first_collective"]
        assert "ERR02200 DIST call hccl api failed." in message
        assert "EJ0001" in message and "Failed to initialize the HCCP process" in message
