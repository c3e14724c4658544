"""One model's own decode on several cards: each card computes a share of its independent tiles.

Some decoders tile themselves (MiniMax-H3's video VAE: 17-frame temporal chunks, each cut into
256-pixel spatial tiles) and then blend the tiles' edges. Each tile comes from one call of an
inner method (``_decode_pixels``) that depends on its own slice of the latent alone; the blend is
cheap elementwise work. ``decode_shared`` runs the model's own ``decode`` twice, on every rank
of a process group:

1. The plan, on every rank: the inner method is stood in for. Call *k* belongs to rank
   ``k % world``; the owner computes the tile for real and keeps it, every rank hands the
   decode an empty tile on the ``meta`` device, so the blend that follows costs nothing and no
   memory. What each call would return (shape, dtype) comes from ``predict``; every tile
   computed is checked against it.
2. The ranks agree (one all-reduce) that every rank planned the same number of calls and that
   no tile failed or came out other than predicted, then each owner sends its tiles to rank 0
   (one batch of point-to-point sends).
3. Rank 0 runs the decode again, each call answered by its tile: the blend, the chunk order,
   the last frames are the model's own code, so the frames are those of one card.

Every rank learns in the same all-reduce whether any rank failed, so none is left waiting on
another: a tile that failed for real (out of memory) stops every rank (``ShareRefused``); a decode
whose tiles could not be planned (its code does what an empty ``meta`` tile cannot, a tile came
out other than predicted, the ranks planned different calls) is decoded whole by rank 0, its
shape told to the others in one more all-reduce.
"""

from contextlib import contextmanager


class ShareRefused(RuntimeError):
    """A rank's share of the tiles failed: nothing was exchanged."""


PLAN, TILE = 1, 2  # what went wrong on a rank: the tiles could not be planned; a tile failed
MAX_DIMS = 8  # the result's dimensions rank 0 tells the others after a whole decode


def _line(exc):
    text = str(exc).strip().splitlines()
    return "%s: %s" % (type(exc).__name__, text[0] if text else "")


@contextmanager
def _standing_in(model, name, replacement):
    """``model.<name>`` is ``replacement`` for this block (an instance attribute over the class's)."""
    had = name in vars(model)
    before = vars(model).get(name)
    setattr(model, name, replacement)
    try:
        yield
    finally:
        if had:
            setattr(model, name, before)
        else:
            delattr(model, name)


def _plan(decode, model, inner, rank, world, predict):
    """Pass 1: (the calls' (owner, shape, dtype), this rank's tiles by call, what went wrong as
    [(PLAN or TILE, why)], the shape of the decode's result)."""
    import torch

    compute = getattr(model, inner)
    calls: list = []
    own: dict = {}
    problem: list = []

    def share(z, *args, **kwargs):
        index = len(calls)
        shape, dtype = predict(z)
        owner = index % world
        calls.append((owner, tuple(shape), dtype))
        if owner == rank and not problem:
            try:
                tile = compute(z, *args, **kwargs)
            except Exception as exc:
                problem.append((TILE, _line(exc)))
                raise
            if tuple(tile.shape) != tuple(shape) or tile.dtype != dtype:
                problem.append((PLAN, "tile %d came out %s %s, predicted %s %s"
                                % (index, tuple(tile.shape), tile.dtype, tuple(shape), dtype)))
            own[index] = tile
        return torch.empty(shape, dtype=dtype, device="meta")

    shape = None
    with _standing_in(model, inner, share):
        try:
            shape = tuple(decode().shape)
        except Exception as exc:  # a tile failed (recorded), or the decode's own code on empty tiles
            if not problem:
                problem.append((PLAN, _line(exc)))
    return calls, own, problem, shape


def _agree(dist, device, calls, problem):
    """Every rank's verdict, as one all-reduce. Raises ``ShareRefused`` where a tile failed on any
    rank; returns why the tiles cannot be shared (rank 0 then decodes whole), or None."""
    import torch

    mine = max((kind for kind, _ in problem), default=0)
    verdict = torch.tensor([mine, len(calls), -len(calls)], dtype=torch.int32, device=device)
    dist.all_reduce(verdict, op=dist.ReduceOp.MAX)
    worst, most, fewest = verdict.tolist()
    if worst == TILE:
        if mine == TILE:
            raise ShareRefused("this card: " + next(why for kind, why in problem if kind == TILE))
        raise ShareRefused("another card's share of the tiles failed (its worker says why)")
    if mine == PLAN:
        return "the decode's tiles could not be planned (%s)" % problem[0][1]
    if worst == PLAN:
        return "another card could not plan the decode's tiles (its worker says why)"
    if most != -fewest:
        return "the cards planned %d and %d tile calls" % (-fewest, most)
    return None


def _whole(decode, dist, device, rank):
    """Rank 0 runs ``decode()`` alone; every rank learns its result's shape (or that it failed)."""
    import torch

    result, error = None, None
    if rank == 0:
        try:
            result = decode()
        except Exception as exc:  # told to the others below, raised here after
            error = exc
    told = torch.zeros(2 + MAX_DIMS, dtype=torch.int32, device=device)
    if result is not None and result.dim() <= MAX_DIMS:
        told[0], told[1] = 1, result.dim()
        told[2:2 + result.dim()] = torch.tensor(list(result.shape), dtype=torch.int32)
    dist.all_reduce(told, op=dist.ReduceOp.MAX)
    if error is not None:
        raise error
    ok, dims = told[:2].tolist()
    if not ok:
        raise ShareRefused("worker 0's decode of the whole failed (its worker says why)")
    return result, tuple(told[2:2 + dims].tolist())


def _exchange(dist, device, rank, calls, own):
    """Each owner's tiles to rank 0; rank 0's table of every tile by call."""
    import torch

    table = dict(own) if rank == 0 else {}
    ops = []
    for index, (owner, shape, dtype) in enumerate(calls):
        if owner == 0:
            continue
        if rank == 0:
            table[index] = torch.empty(shape, dtype=dtype, device=device)
            ops.append(dist.P2POp(dist.irecv, table[index], owner))
        elif owner == rank:
            ops.append(dist.P2POp(dist.isend, own[index].contiguous(), 0))
    if ops:
        for request in dist.batch_isend_irecv(ops):
            request.wait()
    return table


def _assemble(decode, model, inner, calls, table, predict):
    """Pass 2, rank 0: the model's own decode, each tile call answered from ``table``."""
    served: list = []

    def from_table(z, *args, **kwargs):
        index = len(served)
        shape, dtype = predict(z)
        if index >= len(calls) or (tuple(shape), dtype) != calls[index][1:]:
            raise ShareRefused("the second pass asked for a tile the first did not plan (call %d)" % index)
        served.append(index)
        return table.pop(index)

    with _standing_in(model, inner, from_table):
        result = decode()
    if len(served) != len(calls):
        raise ShareRefused("the second pass used %d of %d tiles" % (len(served), len(calls)))
    return result


def decode_shared(decode, model, inner, predict, dist, device):
    """``decode()`` (which calls ``model.<inner>`` once per tile) shared over ``dist``'s world.

    ``predict(z)`` gives (shape, dtype) of ``model.<inner>(z)`` without computing it. Returns
    (the decode's result on rank 0, None elsewhere; the result's shape on every rank; None, or why
    rank 0 decoded it whole). Raises ``ShareRefused`` on every rank when a rank's tile failed."""
    rank, world = dist.get_rank(), dist.get_world_size()
    calls, own, problem, shape = _plan(decode, model, inner, rank, world, predict)
    whole_because = _agree(dist, device, calls, problem)
    if whole_because is not None:
        own.clear()
        result, shape = _whole(decode, dist, device, rank)
        return result, shape, whole_because
    table = _exchange(dist, device, rank, calls, own)
    own.clear()
    if rank != 0:
        return None, shape, None
    return _assemble(decode, model, inner, calls, table, predict), shape, None


def planned_shape(decode, model, inner, predict):
    """The shape ``decode()`` returns, every tile call stood in for on ``meta`` (nothing computed),
    or None where its code cannot run on empty tiles."""
    _calls, _own, problem, shape = _plan(decode, model, inner, -1, 1, predict)
    return None if problem else shape

