"""raylight's xfuser rank bookkeeping takes the argument xfuser 0.5+ added.

raylight (1.7.2 through 1.9.0) makes ``RankGenerator(tp, sp, pp, cfg, dp, order)``;
xfuser 0.5 put ``fs`` before ``order``, so with the xfuser pip installs today (0.7.0) every
worker stops in its constructor with a TypeError, on any device. Where the installed
RankGenerator takes ``fs`` and a call gives six positional arguments, ``fs=1`` (no
sharding, the meaning the six-argument form had) is passed; any other call is xfuser's.
"""

import inspect

from ascend_shim.engine import versions
from ascend_shim.engine.patching import Patch
from ascend_shim.patches.shared.guards import process_on_npu_and_attribute
from ascend_shim.patches.shared.wraps import wrap_function

UNSHARDED = 1


def _takes_fs(rank_generator):
    try:
        return "fs" in inspect.signature(rank_generator).parameters
    except (TypeError, ValueError):
        return False


def _with_fs(module, wrapped, instance, args, kwargs):
    if len(args) == 6 and "fs" not in kwargs and "order" not in kwargs:
        args = args[:5] + (UNSHARDED,) + args[5:]
    return wrapped(*args, **kwargs)


def guard(module):
    reason = process_on_npu_and_attribute("RankGenerator")(module)
    if reason:
        return reason
    if not _takes_fs(module.RankGenerator):
        return "this xfuser's RankGenerator takes raylight's arguments as they are"
    return None


def apply(changes, module):
    wrap_function(changes, module, "RankGenerator", _with_fs)


PATCH = Patch(
    name="raylight_ranks",
    target="raylight.distributed_worker.parallel_group_manager",
    summary="raylight's RankGenerator call gets the fs argument xfuser 0.5+ requires",
    guard=guard,
    apply=apply,
    version=versions.raylight,
)
