"""The simulated HCCL: torch.distributed's ``hccl`` backend on the simulated Ascend bed.

Each process owns simulated cards (``TESTBED_NPU_COUNT``, chosen by
``ASCEND_RT_VISIBLE_DEVICES`` as Ray does per actor); this module lets those processes run
``torch.distributed`` between them as on a 910B box. What was read, in Ascend/pytorch branch
v2.12.0 (@a63ae3a1): torch_npu/_init/registry/distributed.py, torch_npu/distributed/
distributed_c10d.py, torch_npu/csrc/distributed/ProcessGroupHCCL.{hpp,cpp}, HCCLUtils.{hpp,cpp},
torch_npu/csrc/core/npu/NPUException.{h,cpp}; and the CANN HCCL API reference (HcclAllGather,
HcclAllReduce, HcclReduceScatter pages) and user guide (通信域管理).

Registration. :func:`register` (the fake torch_npu calls it at import, as torch_npu's
``register_distributed_backend_for_npu`` does) registers backend ``"hccl"`` with
``extended_api=True`` and ``devices=["npu"]``, so ``init_process_group("hccl")``,
``"cpu:gloo,npu:hccl"``, ``backend=None`` (torch's default map now has ``npu: hccl``),
``new_group(ranks, backend="hccl")`` and ``init_device_mesh("npu", ...)`` go through torch's
own code as with torch_npu. Like torch_npu it sets ``dist.is_hccl_available`` and replaces
``dist.gather`` (see below). ``lccl``, which torch_npu registers too, is not simulated.

How an op gets here. torch keeps its own ``ProcessGroup``; the backend the creator hands it for
``npu`` is a ``ProcessGroupGloo`` on the same store (a Python backend cannot be a c10d
``Backend``: only a whole Python ``ProcessGroup`` can, which would take over the cpu side of
``"cpu:gloo,npu:hccl"`` and miss the ops C++ issues itself). Every collective torch issues,
from Python or from C++ (DDP, functional collectives, DeviceMesh), is a ``c10d::`` dispatcher
op; with an npu tensor among its arguments it reaches ``NpuTensor.__torch_dispatch__``, where a
card's PrivateUse1 kernel would call ProcessGroupHCCL, and the bed's handler (:func:`_c10d`)
takes it instead: it applies ProcessGroupHCCL's checks, counts the traffic, unwraps the npu
tensors to their CPU data and moves it with gloo, in place. Tensors with no npu tensor among
them never get here: a CPU tensor on an hccl-only group fails in torch itself ("No backend type
associated with device type cpu"), as with torch_npu.

What is enforced (wording from the sources above, with torch_npu's DIST_ERROR suffix
``[ERROR] <time> (PID:.., Device:.., RankID:..) ERR02xxx DIST ...`` unless
``TORCH_NPU_COMPACT_ERROR_OUTPUT`` is set):

* tensors: npu and dense, one per call ("Tensor list mustn't be larger than the number of
  available NPUs"), identical type/size/strides, contiguous, all on one card
  (check_npu_tensors_different_devices / _same_device / _single_tensor);
* one card per rank: the communicator is made at a group's first op on a card (lazily, as
  ProcessGroupHCCL does); if two ranks of the group sit on one physical card (by
  ``npu_device.physical_id``, i.e. ASCEND_RT_VISIBLE_DEVICES, on one host) every rank of the
  group fails as HcclCommInitRootInfoConfig does when a second process starts HCCP on a card
  (error code 7, EJ0001 "Failed to initialize the HCCP process", as reported from Ray workers
  sharing a card in verl-project/verl PR #332). HCCL's user guide: one NPU is one rank of a
  communicator, one process per card. On a card the ranks not sharing would instead wait for
  the connect timeout; the bed fails them at once and says why. ProcessGroupHCCL puts no
  "current device" rule on the tensors (it guards to the tensor's card), and neither does the
  bed;
* dtypes: every dtype needs an HCCL type (getHcclDataType: "Unsupported data type for HCCL
  process group"); reductions (all_reduce, reduce, reduce_scatter and their coalesced forms)
  take only int8, int16, int32, int64, float16, float32, bfloat16 on a 910B
  (checkSupportedDataType, "HCCL <op>: Unsupported data type at::kDouble"); uint64/float64 only
  on an Ascend950 (TESTBED_NPU_NAME). all_reduce and reduce cast bool/uint8 to int32 first, as
  torch_npu does; data-movement ops (broadcast, all_gather, all_to_all, send/recv, scatter,
  gather) take every mapped type (HcclAllGather's A2 table: int8 ... uint64, float16/32/64,
  bfp16);
* reduce ops: SUM, PRODUCT, MIN, MAX; AVG as a SUM then ``div_`` by the group size (so an
  integer AVG fails as torch_npu's does); bool SUM as MAX; BAND/BOR/BXOR refused ("Cannot use
  ReduceOp.BAND with HCCL"); PREMUL_SUM checked for its dtype, then refused by the bed: its
  factor cannot be read from the dispatcher's ReduceOp object;
* the ProcessGroupHCCL op set: allreduce(+_coalesced), broadcast, reduce, allgather,
  _allgather_base, allgather_into_tensor_coalesced, reduce_scatter, _reduce_scatter_base,
  reduce_scatter_tensor_coalesced, alltoall_base (with or without split sizes), alltoall,
  barrier (an all_reduce of one float32 on the card, as ProcessGroupHCCL runs it), send, recv,
  scatter, gather. ``gather`` is refused ("ProcessGroupHCCL does not support gather") unless
  ``TORCH_NPU_USE_COMPATIBLE_IMPL=1`` on an A2/A3 SoC, as in torch_npu; ``dist.gather`` still
  works because torch_npu replaces it with an all_gather (warning "HCCL doesn't support gather
  at the moment. Implemented with allgather instead." on dst), and so does the bed.
  recv from any source is refused ("ProcessGroupHCCL does not support recv"),
  allgather_coalesced as c10d's Backend refuses it ("Backend hccl does not support
  allgather_coalesced").

Accounting (:func:`collective_bytes`, :func:`reset_collective_bytes`), per process, keyed
``(physical card, kind)`` with kind the torch.distributed name (``all_reduce``, ``broadcast``,
``all_gather``, ``all_gather_into_tensor``, ``reduce_scatter``, ``reduce_scatter_tensor``,
``all_to_all_single``, ``all_to_all``, ``barrier``, ``send``, ``recv``, ``reduce``,
``scatter``, ``gather`` and the ``*_coalesced`` forms): ``calls`` and the logical payload in
bytes, ``sent`` and ``received``, not what a ring or pairwise algorithm puts on the wire. With
P ranks and S the bytes of the tensor named:

* all_reduce: 2(P-1)/P x S each way (a reduce-scatter then an all-gather: the least any
  algorithm moves through a card, the figure "bus bandwidth" is built on); barrier likewise,
  S = 4 (one float32);
* all_gather, all_gather_into_tensor: (P-1)/P x S each way, S = the gathered output;
* reduce_scatter, reduce_scatter_tensor: (P-1)/P x S each way, S = the input;
* all_to_all_single, all_to_all: sent = input bytes addressed to other ranks, received =
  output bytes from other ranks (per the split sizes; equal splits: (P-1)/P of each);
* broadcast: the root sends S, every other rank receives S; reduce: every other rank sends
  S, the root receives S; scatter: the root sends the P-1 chunks of the others, each other rank
  receives its chunk; gather: the reverse; send/recv: S.

Journal. With ``TESTBED_HCCL_JOURNAL`` naming a folder, every collective counted above is also
appended, when it is counted, as one JSON line ``{"pid", "card", "kind"}`` (the physical card)
to ``<folder>/hccl-<pid>.jsonl``, the file closed at once: what a process did outlives it, where
the counters die with it (raylight's self-test actors exit right after their all_reduce;
tests/e2e/raylight_cases.py reads their lines). Off when the variable is unset.

Timing. A collective runs to completion before its call returns; ``async_op=True`` gives a
work that is already complete (its future holds the npu tensors). send and recv are
asynchronous, as on a card, so every rank may isend before it irecvs (ring attention,
``batch_isend_irecv``); their tag is ignored, as HCCL matches P2P by order alone.

What the bed cannot tell: real bandwidth and latency, HCCS/RoCE topology and which algorithm
HCCL picks, HCCL_CONNECT_TIMEOUT/HCCL_EXEC_TIMEOUT and the watchdog, stream ordering and
overlap (collectives issued on two groups in opposite orders on two ranks run on separate
streams on a card but deadlock here), coalescing (``_start_coalescing`` reaches gloo, which
refuses it; torch's ``batch_isend_irecv`` therefore issues its ops one by one, as for any
backend without coalescing, where torch_npu's replacement coalesces them), uneven all_gather /
reduce_scatter lists (AllGatherV/ReduceScatterV), PREMUL_SUM, lccl, torch_npu's
``batch_isend_irecv`` replacement and its HCCL-only backend methods, and calls made on
``pg._get_backend(npu)`` directly, which reach the gloo transport with npu tensors and fail.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
import warnings

import torch
import torch.distributed as dist

from testbed import npu_device

__all__ = [
    "BACKEND",
    "register",
    "is_registered",
    "collective_bytes",
    "reset_collective_bytes",
]

BACKEND = "hccl"

_C10D = torch._C._distributed_c10d  # the c10d option classes the transport takes
_lock = threading.Lock()
_registered = False
_groups: dict = {}  # group name -> _Group
_RELEASE_WAIT_S = 10.0  # at most, for gloo's worker to drop a finished work's buffers (_run)
_RELEASE_POLL_S = 0.0002
_traffic: dict = {}  # (physical card, kind) -> {"calls", "sent", "received"}

# --------------------------------------------------------------------------- torch_npu's wording

# torch_npu/csrc/core/npu/NPUException: SubModule::DIST is 2; ErrCode number and text
_ERR = {
    "PARAM": (1, "invalid parameter"),
    "TYPE": (2, "invalid type"),
    "VALUE": (3, "invalid value"),
    "NOT_SUPPORT": (7, "feature not supported"),
    "NOT_FOUND": (8, "resource not found"),
    "HCCL": (200, "call hccl api failed"),
}
# HCCLUtils.cpp kHcclDataTypeToStringMap (bool and uint8 share HCCL_DATA_TYPE_UINT8)
_HCCL_TYPE = {
    torch.uint8: "at::kByte/at::kBool",
    torch.bool: "at::kByte/at::kBool",
    torch.int8: "at::kChar",
    torch.int16: "at::kShort",
    torch.int32: "at::kInt",
    torch.int64: "at::kLong",
    torch.float16: "at::kHalf",
    torch.float32: "at::kFloat",
    torch.float64: "at::kDouble",
    torch.bfloat16: "at::kBFloat16",
    torch.uint16: "at::ScalarType::UInt16",
    torch.uint32: "at::ScalarType::UInt32",
    torch.uint64: "at::ScalarType::UInt64",
    torch.float8_e4m3fn: "at::ScalarType::Float8_e4m3fn",
    torch.float8_e5m2: "at::ScalarType::Float8_e5m2",
}
# checkSupportedDataType: what reductions take; Ascend950 adds uint64 and float64
_REDUCIBLE = frozenset({torch.int8, torch.int16, torch.int32, torch.float16, torch.float32, torch.bfloat16,
                        torch.int64})
_REDUCIBLE_A5 = frozenset({torch.uint64, torch.float64})
# what the gloo transport reduces itself; int16 travels as int32 (HCCL reduces it natively)
_GLOO_REDUCIBLE = frozenset({torch.int8, torch.int32, torch.int64, torch.float16, torch.float32, torch.bfloat16,
                             torch.float64, torch.uint8})
_RED: dict = {}  # ReduceOp.RedOpType value -> name (filled by register)


def _dist_error(code: str) -> str:
    """torch_npu's DIST_ERROR(ErrCode::<code>) suffix (empty under TORCH_NPU_COMPACT_ERROR_OUTPUT)."""
    if npu_device._strtol(os.environ.get("TORCH_NPU_COMPACT_ERROR_OUTPUT")):
        return ""
    number, text = _ERR[code]
    device = npu_device.thread_device()
    rank = npu_device._strtol(os.environ.get("RANK"))
    return "\n[ERROR] %s (PID:%d, Device:%d, RankID:%d) ERR%02d%03d DIST %s" % (
        time.strftime("%Y-%m-%d-%H:%M:%S"), os.getpid(), -1 if device is None else device,
        -1 if rank is None else rank, 2, number, text)


def _fail(message: str, code: str, kind=RuntimeError):
    return kind(message + _dist_error(code))


def _is_a5() -> bool:
    # c10_npu::GetSocVersion() >= Ascend950; the fake torch_npu's SoC is TESTBED_NPU_NAME
    return os.environ.get("TESTBED_NPU_NAME", "Ascend910B3").startswith("Ascend950")


def _compatible_mode() -> bool:
    """TORCH_NPU_USE_COMPATIBLE_IMPL=1 on an A2/A3 SoC (IsCompatibleSoc: 910B*, 910_93*)."""
    name = os.environ.get("TESTBED_NPU_NAME", "Ascend910B3")
    return os.environ.get("TORCH_NPU_USE_COMPATIBLE_IMPL") == "1" and name.startswith(("Ascend910B", "Ascend910_93"))


# --------------------------------------------------------------------------- registration


def is_registered() -> bool:
    return _registered


def register() -> None:
    """Register the ``hccl`` backend for ``npu`` and take the ``c10d`` ops (once per process)."""
    global _registered
    with _lock:
        if _registered or not dist.is_available():
            return
        _RED.update({int(v): name for name, v in dist.ReduceOp.RedOpType.__members__.items()})
        dist.Backend.register_backend(BACKEND, _create, extended_api=True, devices=["npu"])
        npu_device.set_namespace_handler("c10d", _c10d)
        # torch_npu/_init/patches/distributed_patches.py: public aliases set at import
        dist.is_hccl_available = lambda: BACKEND in dist.Backend.backend_list
        original = dist.distributed_c10d.gather
        patched = _gather_patch(original)
        dist.gather = patched
        dist.distributed_c10d.gather = patched
        _registered = True


class _Group:
    """One hccl process group of this process: its gloo transport and its communicators."""

    def __init__(self, name, transport, store, rank, size):
        self.name = name
        self.transport = transport
        self.store = store
        self.rank = rank
        self.size = size
        self.comms: dict = {}  # npu index -> physical card, once its communicator exists

    def comm(self, index: int) -> int:
        """The physical card of this rank's communicator on npu ``index`` (made on first use)."""
        card = self.comms.get(index)
        if card is not None:
            return card
        card = npu_device.physical_id(index)
        seq = len(self.comms)
        key = "testbed_hccl/comm%d/card/" % seq
        here = "%s/%d" % (socket.gethostname(), card)
        self.store.set(key + str(self.rank), here)
        seen = [self.store.get(key + str(r)).decode() for r in range(self.size)]
        shared = [r for r in range(self.size) if seen.count(seen[r]) > 1]
        if shared:
            where = ", ".join("rank %d on physical card %s of host %s" % (r, seen[r].rsplit("/", 1)[1],
                                                                            seen[r].rsplit("/", 1)[0])
                              for r in shared)
            raise RuntimeError(
                "create_config:torch_npu/csrc/distributed/HCCLUtils.cpp:140 HCCL function error: "
                "hcclCommInitRootInfoConfig(numRanks, &rootInfo, rank, config, &(comm->hcclComm_)), "
                "error code is 7 " + _dist_error("HCCL") + ".\n"
                "EJ0001: [PID: %d] %s Failed to initialize the HCCP process. Reason: Maybe the last training "
                "process is running.\n        Solution: Wait for 10s after killing the last training process "
                "and try again.\n(testbed: group %s has %s; HCCL takes one card per rank)"
                % (os.getpid(), time.strftime("%Y-%m-%d-%H:%M:%S"), self.name, where))
        self.comms[index] = card
        return card


def _create(opts, pg_options):
    """The creator torch calls for an hccl group: a gloo transport on the group's store."""
    transport = dist.ProcessGroupGloo(opts.store, opts.group_rank, opts.group_size, opts.timeout)
    with _lock:
        _groups[str(opts.group_id)] = _Group(str(opts.group_id), transport, opts.store, opts.group_rank,
                                             opts.group_size)
    return transport


# --------------------------------------------------------------------------- accounting


def collective_bytes() -> dict:
    """``{(physical card, kind): {"calls": n, "sent": bytes, "received": bytes}}`` since the last
    reset, for the ops this process issued (the module docstring defines the payload)."""
    with _lock:
        return {key: dict(value) for key, value in _traffic.items()}


def reset_collective_bytes() -> None:
    with _lock:
        _traffic.clear()


def _count(card: int, kind: str, sent: float, received: float) -> None:
    with _lock:
        entry = _traffic.setdefault((card, kind), {"calls": 0, "sent": 0, "received": 0})
        entry["calls"] += 1
        entry["sent"] += int(round(sent))
        entry["received"] += int(round(received))
    folder = os.environ.get("TESTBED_HCCL_JOURNAL")
    if folder:
        _journal(folder, card, kind)


def _journal(folder: str, card: int, kind: str) -> None:
    """One line per collective in ``<folder>/hccl-<pid>.jsonl`` (the module docstring's Journal)."""
    os.makedirs(folder, exist_ok=True)
    line = json.dumps({"pid": os.getpid(), "card": card, "kind": kind}) + "\n"
    with _lock, open(os.path.join(folder, "hccl-%d.jsonl" % os.getpid()), "a", encoding="utf-8") as journal:
        journal.write(line)


def _nbytes(t) -> int:
    return t.numel() * t.element_size()


# --------------------------------------------------------------------------- ProcessGroupHCCL's checks


def _is_npu(t) -> bool:
    return isinstance(t, torch.Tensor) and t.device.type == npu_device.DEVICE_TYPE and not t.is_sparse


def _check_different_devices(tensors) -> None:
    if len(tensors) == 0:
        raise _fail("Tensor list must be nonempty", "PARAM")
    if len(tensors) != 1:
        raise _fail("Tensor list mustn't be larger than the number of available NPUs", "VALUE")
    _check_single(tensors[0])


def _check_same_device(tensors) -> None:
    if len(tensors) == 0:
        raise _fail("Tensor list must be nonempty", "PARAM")
    first = tensors[0]
    for t in tensors:
        if not _is_npu(t):
            raise _fail("Tensors must be NPU and dense", "TYPE")
        if t.dtype != first.dtype:
            raise _fail("Tensors must have identical type", "TYPE")
        if not _non_overlapping_and_dense(t):
            raise _fail("Tensors must be non-overlapping and dense", "TYPE")
        if t.device != first.device:
            raise _fail("Tensors must be on same NPU device", "TYPE")


def _check_single(t) -> None:
    if not _is_npu(t):
        raise _fail("Tensors must be NPU and dense", "TYPE")
    if not t.is_contiguous(memory_format=torch._prims_common.suggest_memory_format(t)):
        raise _fail("Tensors must be contiguous", "TYPE")


def _non_overlapping_and_dense(t) -> bool:
    """at::Tensor::is_non_overlapping_and_dense: some permutation of the dims is contiguous."""
    expected = 1
    for d in sorted(range(t.dim()), key=lambda d: (t.stride(d), t.size(d))):
        if t.size(d) == 1:
            continue
        if t.stride(d) != expected:
            return False
        expected *= t.size(d)
    return True


def _hccl_type(dtype) -> None:
    if dtype not in _HCCL_TYPE:
        raise RuntimeError("Unsupported data type for HCCL process group" + _dist_error("NOT_SUPPORT"))


def _check_reducible(dtype, function: str) -> None:
    _hccl_type(dtype)
    if dtype in _REDUCIBLE or (_is_a5() and dtype in _REDUCIBLE_A5):
        return
    raise _fail("HCCL %s: Unsupported data type %s" % (function, _HCCL_TYPE[dtype]), "NOT_SUPPORT")


def _reduce_op(op_object, dtype) -> str:
    """getHcclReduceOp: the op HCCL runs (AVG and PREMUL_SUM as SUM; bool SUM as MAX)."""
    name = _RED.get(op_object.op(), "UNUSED")
    if name == "AVG":
        return "SUM"
    if name == "PREMUL_SUM":
        if dtype not in (torch.float16, torch.float32, torch.bfloat16, torch.float64):
            raise _fail("PreMulSum Data type must be half, float, bfloat16 or double", "TYPE")
        raise NotImplementedError(
            "testbed: ReduceOp.PREMUL_SUM on hccl: the bed cannot read the premul factor from the "
            "dispatcher's ReduceOp object, so it does not run it")
    if name == "SUM" and dtype == torch.bool:
        return "MAX"
    if name in ("BAND", "BOR", "BXOR"):
        raise _fail("Cannot use ReduceOp.%s with HCCL" % name, "NOT_SUPPORT")
    if name not in ("SUM", "PRODUCT", "MIN", "MAX"):
        raise _fail("Unhandled ReduceOp", "NOT_FOUND")
    return name


def _is_avg(op_object) -> bool:
    return _RED.get(op_object.op()) == "AVG"


# --------------------------------------------------------------------------- transport helpers


def _cpu(t):
    return npu_device.unwrap(t)


def _bytes(t):
    """A flat uint8 view of a contiguous npu tensor's CPU data (gloo moves any dtype as bytes)."""
    cpu = _cpu(t)
    return cpu.reshape(-1).view(torch.uint8) if cpu.dim() else cpu.reshape(1).view(torch.uint8)


class _Staged:
    """Buffers the transport works on, copied back into the caller's tensors once it is done."""

    def __init__(self):
        self.back: list = []

    def bytes_out(self, t):
        """A byte buffer for output ``t`` (a dense but non-contiguous one is staged)."""
        cpu = _cpu(t)
        if cpu.is_contiguous():
            return _bytes(t)
        tmp = torch.empty(cpu.shape, dtype=cpu.dtype)
        self.back.append((cpu, tmp))
        return tmp.reshape(-1).view(torch.uint8)

    def bytes_in(self, t):
        cpu = _cpu(t)
        return _bytes(t) if cpu.is_contiguous() else cpu.contiguous().reshape(-1).view(torch.uint8)

    def reducible(self, cpu, work_dtype):
        """``cpu`` as the transport reduces it: int16 (and HCCL's bool/uint8 cast) as int32."""
        if cpu.dtype == work_dtype and work_dtype in _GLOO_REDUCIBLE and cpu.is_contiguous():
            return cpu
        kind = torch.int32 if work_dtype == torch.int16 else work_dtype
        tmp = cpu.to(kind, memory_format=torch.contiguous_format)
        self.back.append((cpu, tmp))
        return tmp

    def finish(self, avg_buffers=(), size=1):
        for buf in avg_buffers:  # torch_npu divides the tensor HCCL reduced (the int32 copy for bool)
            buf.div_(size)
        for target, tmp in self.back:
            target.copy_(tmp)


def _opts(cls, **fields):
    o = cls()
    for name, value in fields.items():
        setattr(o, name, value)
    return o


def _red(name):
    return getattr(dist.ReduceOp, name)


def _done(outputs):
    """A completed c10d Work whose future holds ``outputs``, boxed for the dispatcher."""
    fut = torch.futures.Future()
    fut.set_result(list(outputs))
    return torch._C._distributed_c10d._create_work_from_future(fut).boxed()


def _tensors(values):
    for value in values:
        if isinstance(value, torch.Tensor):
            yield value
        elif isinstance(value, (list, tuple)):
            yield from _tensors(value)


def _run(call, *args) -> None:
    """One transport collective, run to completion, returning once gloo has let go of its buffers.

    Gloo's worker thread completes a work's future before it drops the work, and the buffers it
    holds. Where that drop is the buffers' last reference, freeing them takes the GIL; in a process
    already finalizing (the last collective right before exit) that aborts it ("terminate called
    without an active exception", pytorch/pytorch#179291; seen in this bed's two-rank runs), a
    crash real HCCL does not have. So the buffers stay referenced here until the transport's count
    on them is gone (a few microseconds), and their last reference is always this thread's.
    """
    held = list(_tensors(args))
    baseline = [t._use_count() for t in held]
    work = call(*args)
    work.wait()
    del work
    deadline = time.monotonic() + _RELEASE_WAIT_S
    while any(t._use_count() > n for t, n in zip(held, baseline)) and time.monotonic() < deadline:
        time.sleep(_RELEASE_POLL_S)


# --------------------------------------------------------------------------- the ops


def _bind(func, args, kwargs) -> dict:
    bound = {}
    for position, argument in enumerate(func._schema.arguments):
        if position < len(args):
            bound[argument.name] = args[position]
        elif argument.name in kwargs:
            bound[argument.name] = kwargs[argument.name]
        elif argument.has_default_value():
            bound[argument.name] = argument.default_value
    return bound


def _c10d(func, args, kwargs):
    """npu_device's handler for ``c10d::`` ops on npu tensors: ProcessGroupHCCL's part."""
    handler = _OPS.get(func._schema.name)
    if handler is None:
        return NotImplemented
    b = _bind(func, args, kwargs)
    pg = dist.ProcessGroup.unbox(b["process_group"])
    group = _groups.get(pg.group_name)
    if group is None:
        return NotImplemented  # no hccl backend on this group: torch's own kernel says so
    return handler(group, b)


def _allreduce(group, b):
    tensors = b["tensors"]
    _check_different_devices(tensors)
    t = tensors[0]
    card = group.comm(t.device.index)
    work_dtype = torch.int32 if t.dtype in (torch.bool, torch.uint8) else t.dtype
    _check_reducible(work_dtype, "allreduce")
    op = _reduce_op(b["reduce_op"], work_dtype)
    p, s = group.size, _nbytes(t)
    _count(card, "all_reduce", 2 * (p - 1) / p * s, 2 * (p - 1) / p * s)
    stage = _Staged()
    buf = stage.reducible(_cpu(t), work_dtype)
    _run(group.transport.allreduce, [buf], _opts(_C10D.AllreduceOptions, reduceOp=_red(op)))
    stage.finish([buf] if _is_avg(b["reduce_op"]) else (), p)
    return tensors, _done(tensors)


def _allreduce_coalesced(group, b):
    tensors = b["tensors"]
    _check_same_device(tensors)
    card = group.comm(tensors[0].device.index)
    p = group.size
    stage = _Staged()
    avg = []
    for t in tensors:
        work_dtype = torch.int32 if t.dtype in (torch.bool, torch.uint8) else t.dtype
        _check_reducible(work_dtype, "allreduce_coalesced")
        op = _reduce_op(b["reduce_op"], work_dtype)
        buf = stage.reducible(_cpu(t), work_dtype)
        _run(group.transport.allreduce, [buf], _opts(_C10D.AllreduceOptions, reduceOp=_red(op)))
        if _is_avg(b["reduce_op"]):
            avg.append(buf)
    total = sum(_nbytes(t) for t in tensors)
    _count(card, "all_reduce_coalesced", 2 * (p - 1) / p * total, 2 * (p - 1) / p * total)
    stage.finish(avg, p)
    return _done(tensors)


def _broadcast(group, b):
    tensors = b["tensors"]
    _check_different_devices(tensors)
    t = tensors[0]
    card = group.comm(t.device.index)
    _hccl_type(t.dtype)
    root = b["root_rank"] * len(tensors) + b["root_tensor"]
    s = _nbytes(t)
    _count(card, "broadcast", s if group.rank == root else 0, 0 if group.rank == root else s)
    _run(group.transport.broadcast, [_bytes(t)], _opts(_C10D.BroadcastOptions, rootRank=root, rootTensor=0))
    return tensors, _done(tensors)


def _reduce(group, b):
    tensors = b["tensors"]
    _check_different_devices(tensors)
    t = tensors[0]
    card = group.comm(t.device.index)
    work_dtype = torch.int32 if t.dtype in (torch.bool, torch.uint8) else t.dtype
    _check_reducible(work_dtype, "reduce")
    op = _reduce_op(b["reduce_op"], work_dtype)
    root, s = b["root_rank"], _nbytes(t)
    _count(card, "reduce", 0 if group.rank == root else s, s if group.rank == root else 0)
    stage = _Staged()
    buf = stage.reducible(_cpu(t), work_dtype)
    _run(group.transport.reduce, [buf], _opts(_C10D.ReduceOptions, rootRank=root, rootTensor=0, reduceOp=_red(op)))
    stage.finish([buf] if _is_avg(b["reduce_op"]) else (), group.size)
    return _done(tensors)


def _allgather(group, b):
    outputs, inputs = b["output_tensors"], b["input_tensors"]
    _check_same_device(outputs[-1])
    _check_different_devices(inputs)
    t = inputs[0]
    card = group.comm(t.device.index)
    _hccl_type(t.dtype)
    outs = outputs[0]
    if any(o.numel() != outs[0].numel() for o in outs):
        raise NotImplementedError("testbed: uneven all_gather lists (HCCL's AllGatherV) are not simulated")
    if len(outs) != group.size:
        raise _fail("Tensor list input to scatter/gather must match number of collective participants", "PARAM")
    if outs[0].numel() != t.numel():
        raise _fail("All tensor operands to scatter/gather must have the same size", "PARAM")
    p, s = group.size, sum(_nbytes(o) for o in outs)
    _count(card, "all_gather", (p - 1) / p * s, (p - 1) / p * s)
    stage = _Staged()
    out_bufs = [stage.bytes_out(o) for o in outs]
    _run(group.transport.allgather, [out_bufs], [_bytes(t)], _C10D.AllgatherOptions())
    stage.finish()
    return outputs, _done([o for o in outs])


def _allgather_base(group, b):
    out, t = b["output_tensor"], b["input_tensor"]
    if t.dtype != out.dtype:
        raise _fail("output tensor must have the same type as input tensor", "PARAM")
    if t.numel() * group.size != out.numel():
        raise _fail("output tensor size must be equal to world_size times input tensor size", "PARAM")
    _check_different_devices([t])
    _check_different_devices([out])
    card = group.comm(t.device.index)
    _hccl_type(t.dtype)
    p, s = group.size, _nbytes(out)
    _count(card, "all_gather_into_tensor", (p - 1) / p * s, (p - 1) / p * s)
    _run(group.transport._allgather_base, _bytes(out), _bytes(t), _C10D.AllgatherOptions())
    return out, _done([out])


def _allgather_into_tensor_coalesced(group, b):
    outs, ins = b["outputs"], b["inputs"]
    for t in (*outs, *ins):
        if not _is_npu(t):
            raise _fail("Tensors must be NPU and dense", "TYPE")
    card = group.comm(ins[0].device.index)
    p = group.size
    for out, t in zip(outs, ins):
        _hccl_type(t.dtype)
        _run(group.transport._allgather_base, _bytes(out), _bytes(t), _C10D.AllgatherOptions())
    s = sum(_nbytes(o) for o in outs)
    _count(card, "all_gather_into_tensor_coalesced", (p - 1) / p * s, (p - 1) / p * s)
    return _done(outs)


def _reduce_scatter_flat(group, stage, out_cpu, in_cpu, work_dtype, op):
    """Reduce ``in_cpu`` (P x n elements) across ranks into ``out_cpu`` (n) with gloo."""
    in_buf = stage.reducible(in_cpu.reshape(-1) if in_cpu.is_contiguous() else in_cpu.contiguous().reshape(-1),
                             work_dtype)
    out_buf = stage.reducible(out_cpu, work_dtype)
    _run(group.transport._reduce_scatter_base, out_buf.reshape(-1), in_buf,
                                               _opts(_C10D.ReduceScatterOptions, reduceOp=_red(op)))
    return out_buf


def _reduce_scatter(group, b):
    outputs, inputs = b["output_tensors"], b["input_tensors"]
    _check_different_devices(outputs)
    _check_same_device(inputs[-1])
    out = outputs[0]
    card = group.comm(out.device.index)
    work_dtype = out.dtype
    _check_reducible(work_dtype, "reduce_scatter")
    op = _reduce_op(b["reduce_op"], work_dtype)
    ins = inputs[0]
    if len(ins) != group.size or any(i.numel() != out.numel() for i in ins):
        raise NotImplementedError("testbed: uneven reduce_scatter lists (HCCL's ReduceScatterV) are not simulated")
    p, s = group.size, sum(_nbytes(i) for i in ins)
    _count(card, "reduce_scatter", (p - 1) / p * s, (p - 1) / p * s)
    stage = _Staged()
    flat = torch.cat([_cpu(i).reshape(-1) for i in ins])
    buf = _reduce_scatter_flat(group, stage, _cpu(out), flat, work_dtype, op)
    stage.finish([buf] if _is_avg(b["reduce_op"]) else (), p)
    return outputs, _done(outputs)


def _reduce_scatter_base(group, b):
    out, t = b["output_tensor"], b["input_tensor"]
    _check_single(t)
    if t.dtype != out.dtype:
        raise _fail("input tensor must be the same type as the output tensor.", "TYPE")
    if t.numel() != out.numel() * group.size:
        raise _fail("input tensor must be the same size as output size times world size", "PARAM")
    card = group.comm(t.device.index)
    _check_reducible(t.dtype, "_reduce_scatter_base")
    op = _reduce_op(b["reduce_op"], t.dtype)
    p, s = group.size, _nbytes(t)
    _count(card, "reduce_scatter_tensor", (p - 1) / p * s, (p - 1) / p * s)
    stage = _Staged()
    buf = _reduce_scatter_flat(group, stage, _cpu(out), _cpu(t), t.dtype, op)
    stage.finish([buf] if _is_avg(b["reduce_op"]) else (), p)
    return out, _done([out])


def _reduce_scatter_tensor_coalesced(group, b):
    outs, ins = b["outputs"], b["inputs"]
    _check_same_device(outs)
    _check_same_device(ins)
    card = group.comm(ins[0].device.index)
    p = group.size
    stage = _Staged()
    avg = []
    for out, t in zip(outs, ins):
        _check_reducible(t.dtype, "reduce_scatter_tensor_coalesced")
        op = _reduce_op(b["reduce_op"], t.dtype)
        buf = _reduce_scatter_flat(group, stage, _cpu(out), _cpu(t), t.dtype, op)
        if _is_avg(b["reduce_op"]):
            avg.append(buf)
    s = sum(_nbytes(t) for t in ins)
    _count(card, "reduce_scatter_tensor_coalesced", (p - 1) / p * s, (p - 1) / p * s)
    stage.finish(avg, p)
    return _done(outs)


def _split_sizes(splits, t, p):
    """check_split_sizes: ``splits`` (rows of dim 0 per rank) or an equal split."""
    if not splits:
        if t.size(0) % p:
            raise _fail("Tensor's dim 0 does not divide equally across group size", "PARAM")
        return [t.size(0) // p] * p
    if len(splits) != p:
        raise _fail("Number of tensor splits not equal to group size", "TYPE")
    if sum(splits) != t.size(0):
        raise _fail("Split sizes doesn't match total dim 0 size", "TYPE")
    return list(splits)


def _alltoall_base(group, b):
    out, t = b["output"], b["input"]
    _check_single(out)
    _check_single(t)
    p = group.size
    out_splits, in_splits = list(b["output_split_sizes"]), list(b["input_split_sizes"])
    if not out_splits and not in_splits:
        if out.numel() != t.numel() or out.dtype != t.dtype:
            raise _fail("Tensors are not equal in size or data type", "PARAM")
        if t.dim() < 1 or out.dim() < 1:
            raise _fail("Scalar tensors (0-dim tensors) are not supported in alltoall. inputTensor.dim()=%d, "
                        "outputTensor.dim()=%d. Please reshape tensors to at least 1-D before calling alltoall."
                        % (t.dim(), out.dim()), "NOT_SUPPORT")
        if out.size(0) % p:
            raise _fail("Tensor's dim 0 does not divide equally across group size", "PARAM")
    out_splits = _split_sizes(out_splits, out, p)
    in_splits = _split_sizes(in_splits, t, p)
    card = group.comm(t.device.index)
    _hccl_type(t.dtype)
    in_row = _nbytes(t) // t.size(0) if t.size(0) else 0
    out_row = _nbytes(out) // out.size(0) if out.size(0) else 0
    in_bytes = [n * in_row for n in in_splits]
    out_bytes = [n * out_row for n in out_splits]
    me = group.rank
    _count(card, "all_to_all_single", sum(in_bytes) - in_bytes[me], sum(out_bytes) - out_bytes[me])
    _run(group.transport.alltoall_base, _bytes(out), _bytes(t), out_bytes, in_bytes, _C10D.AllToAllOptions())
    return _done([out])


def _alltoall(group, b):
    outs, ins = b["output_tensors"], b["input_tensors"]
    if len(outs) != group.size:
        raise _fail("the size of output_tensors and worldsize must equal", "PARAM")
    if len(outs) != len(ins):
        raise _fail("the size of input_tensors and output_tensors must equal", "PARAM")
    device = outs[0].device
    for o, i in zip(outs, ins):
        _check_single(o)
        _check_single(i)
        if o.device != device or i.device != device:
            raise _fail("tensors must be on the same device", "PARAM")
    card = group.comm(device.index)
    for t in (*outs, *ins):
        _hccl_type(t.dtype)
    me = group.rank
    _count(card, "all_to_all", sum(_nbytes(i) for r, i in enumerate(ins) if r != me),
           sum(_nbytes(o) for r, o in enumerate(outs) if r != me))
    _run(group.transport.alltoall, [_bytes(o) for o in outs], [_bytes(i) for i in ins], _C10D.AllToAllOptions())
    return outs, _done(outs)


def _barrier(group, b):
    # ProcessGroupHCCL::barrier ignores the tensor it is given: an all_reduce of ones(1, float32)
    # on each card this group used, else on the current card
    indices = list(group.comms) or [npu_device.current_device()]
    p = group.size
    for index in indices:
        card = group.comm(index)
        _count(card, "barrier", 2 * (p - 1) / p * 4, 2 * (p - 1) / p * 4)
        _run(group.transport.allreduce, [torch.ones(1)], _C10D.AllreduceOptions())
    return _done([])


def _root_args(op: str, rank, size):
    def invalid(message):
        return ValueError("ProcessGroupHCCL::%s: %s" % (op, message))
    if rank < 0 or rank >= size:
        raise invalid("invalid root rank: %d" % rank)
    return invalid


def _match_all(invalid, tensors, like):
    for index, t in enumerate(tensors):
        if t.dtype != like.dtype or t.device != like.device:
            raise invalid("invalid tensor type at index %d" % index)
        if t.shape != like.shape:
            raise invalid("invalid tensor size at index %d (expected %s, got %s)"
                          % (index, list(like.shape), list(t.shape)))


def _scatter(group, b):
    outputs, inputs, root = b["output_tensors"], b["input_tensors"], b["root_rank"]
    invalid = _root_args("scatter", root, group.size)
    _check_different_devices(outputs)
    if len(outputs) != 1:
        raise invalid("requires a single-element input tensor list")
    out = outputs[0]
    if group.rank == root:
        if len(inputs) != 1:
            raise invalid("requires a single-element input list containing a list with %d tensors." % group.size)
        if len(inputs[0]) != group.size:
            raise invalid("Incorrect input list size %d. Input list size should be %d, same as size of the "
                          "process group." % (len(inputs[0]), group.size))
        _match_all(invalid, inputs[0], out)
    elif len(inputs) != 0:
        raise invalid("requires empty input on non-root")
    card = group.comm(out.device.index)
    _hccl_type(out.dtype)
    s = _nbytes(out)
    p = group.size
    _count(card, "scatter", (p - 1) * s if group.rank == root else 0, 0 if group.rank == root else s)
    stage = _Staged()
    ins = [[stage.bytes_in(i) for i in inputs[0]]] if group.rank == root else []
    _run(group.transport.scatter, [_bytes(out)], ins, _opts(_C10D.ScatterOptions, rootRank=root))
    return outputs, _done(outputs)


def _gather(group, b):
    outputs, inputs, root = b["output_tensors"], b["input_tensors"], b["root_rank"]
    invalid = _root_args("gather", root, group.size)
    _check_different_devices(inputs)
    if len(inputs) != 1:
        raise invalid("requires a single-element input tensor list")
    t = inputs[0]
    if group.rank == root:
        if len(outputs) != 1:
            raise invalid("requires a single-element output list containing a list with %d tensors."
                          % group.size)
        if len(outputs[0]) != group.size:
            raise invalid("Incorrect output list size %d. Output list size should be %d, same as size of the "
                          "process group." % (len(outputs[0]), group.size))
        _match_all(invalid, outputs[0], t)
    elif len(outputs) != 0:
        raise invalid("requires empty output on non-root")
    if not _compatible_mode():
        raise RuntimeError("ProcessGroupHCCL does not support gather" + _dist_error("NOT_SUPPORT"))
    card = group.comm(t.device.index)
    _hccl_type(t.dtype)
    s, p = _nbytes(t), group.size
    _count(card, "gather", 0 if group.rank == root else s, (p - 1) * s if group.rank == root else 0)
    stage = _Staged()
    outs = [[stage.bytes_out(o) for o in outputs[0]]] if group.rank == root else []
    _run(group.transport.gather, outs, [_bytes(t)], _opts(_C10D.GatherOptions, rootRank=root))
    stage.finish()
    return _done(outputs[0] if outputs else [])


def _p2p_done(work, tensors):
    """The transport's own (pending) work, with the npu tensors as its future's value."""
    try:
        fut = work.get_future().then(lambda _: list(tensors))
    except RuntimeError:
        return work.boxed()
    return torch._C._distributed_c10d._create_work_from_future(fut).boxed()


def _send(group, b):
    tensors = b["tensors"]
    _check_different_devices(tensors)
    t = tensors[0]
    card = group.comm(t.device.index)
    _hccl_type(t.dtype)
    _count(card, "send", _nbytes(t), 0)
    return _p2p_done(group.transport.send([_bytes(t)], b["dst"], 0), tensors)


def _recv(group, b):
    tensors = b["tensors"]
    _check_different_devices(tensors)
    t = tensors[0]
    card = group.comm(t.device.index)
    _hccl_type(t.dtype)
    _count(card, "recv", 0, _nbytes(t))
    return _p2p_done(group.transport.recv([_bytes(t)], b["src"], 0), tensors)


def _recv_any_source(group, b):
    raise RuntimeError("ProcessGroupHCCL does not support recv" + _dist_error("NOT_SUPPORT"))


def _allgather_coalesced(group, b):
    # not overridden by ProcessGroupHCCL: c10d's Backend default refuses it
    raise RuntimeError("Backend hccl does not support allgather_coalesced")


_OPS = {
    "c10d::allreduce_": _allreduce,
    "c10d::allreduce_coalesced_": _allreduce_coalesced,
    "c10d::broadcast_": _broadcast,
    "c10d::reduce_": _reduce,
    "c10d::allgather_": _allgather,
    "c10d::_allgather_base_": _allgather_base,
    "c10d::allgather_into_tensor_coalesced_": _allgather_into_tensor_coalesced,
    "c10d::allgather_coalesced_": _allgather_coalesced,
    "c10d::reduce_scatter_": _reduce_scatter,
    "c10d::_reduce_scatter_base_": _reduce_scatter_base,
    "c10d::reduce_scatter_tensor_coalesced_": _reduce_scatter_tensor_coalesced,
    "c10d::alltoall_base_": _alltoall_base,
    "c10d::alltoall_": _alltoall,
    "c10d::barrier": _barrier,
    "c10d::scatter_": _scatter,
    "c10d::gather_": _gather,
    "c10d::send": _send,
    "c10d::recv_": _recv,
    "c10d::recv_any_source_": _recv_any_source,
}


# --------------------------------------------------------------------------- torch_npu's dist.gather


def _gather_patch(original):
    """torch_npu replaces ``dist.gather``: on npu tensors, outside compatible mode, it runs an
    all_gather (sizes first broadcast from dst) and warns on dst; in compatible mode it calls the
    backend's gather. torch_npu calls ``pg._get_backend(npu)`` directly; the bed goes through the
    ProcessGroup instead (a direct backend call would reach the gloo transport)."""

    def gather(tensor, gather_list=None, dst=0, group=None, async_op=False, **kwargs):
        if tensor.device.type != npu_device.DEVICE_TYPE or kwargs:
            return original(tensor, gather_list, dst, group, async_op, **kwargs)
        dc = dist.distributed_c10d
        dc._check_single_tensor(tensor, "tensor")
        if gather_list:
            dc._check_tensor_list(gather_list, "gather_list")
        else:
            gather_list = []
        dc._ensure_all_tensors_same_dtype(tensor, gather_list)
        if dc._rank_not_in_group(group):
            dc._warn_not_in_group("gather")
            return None
        me = dist.get_rank()
        dc._validate_output_list_for_rank(me, dst, gather_list)
        pg = group if group is not None else dc._get_default_group()
        if _compatible_mode():
            opts = _opts(_C10D.GatherOptions, rootRank=dist.get_group_rank(pg, dst) if group is not None else dst)
            work = pg.gather([gather_list] if me == dst else [], [tensor], opts)
        else:
            if me == dst:
                warnings.warn("HCCL doesn't support gather at the moment. Implemented with allgather instead.")
            sizes = [None] * dist.get_world_size(group) if me != dst else [t.size() for t in gather_list]
            dist.broadcast_object_list(sizes, dst, group)
            if not gather_list:
                gather_list = [torch.empty(size, dtype=tensor.dtype).npu() for size in sizes]
            work = pg.allgather([gather_list], [tensor])
        if async_op:
            return work
        work.wait()
        return None

    gather.__wrapped__ = original
    return gather
