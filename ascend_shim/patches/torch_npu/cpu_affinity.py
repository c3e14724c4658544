"""Host dispatch: ``CPU_AFFINITY_CONF`` with the physical card's cores in a process that sees part of the box.

torch_npu (2.12, ``NPUAffinityController.cpp``) reads ``CPU_AFFINITY_CONF`` once, when a thread
first binds (the device's first initialisation), and computes the default core range of device
``d`` as block ``d`` of ``online cores / cards this process sees``: ``d`` is the index this process
sees, not the physical card. Its ``npuN:a-b`` ranges are keyed by that index too. A Ray worker (or
a launcher's one-card ComfyUI) sees its card as device 0: with binding on and no range given,
its card's range is every core (mode 1) and its hot threads sit on cores 0-3 (mode 2), the same
cores as every other such process on the box.

So in a process that sees some but not all of the box's cards, where nobody set
``CPU_AFFINITY_CONF``, each visible card is given its physical card's share explicitly, in mode 1
(coarse: torch_npu's threads of a card stay in that card's share, none is pinned to one core):
``1,npu0:a-b[,npu1:c-d...]`` with card ``p``'s share block ``p`` of ``online cores / box cards``,
the rule torch_npu itself applies where a process sees every card. A process that sees every card
(ComfyUI's) is left as torch_npu leaves it, unbound: binding would confine its prompt thread, which
torch_npu binds on its first use of the card, to one card's share, beside worker 0; it records
the box's card count (``ASCEND_SHIM_NPU_BOX``) for the processes it starts. Nothing is set where
the user set ``CPU_AFFINITY_CONF`` (kept, and named when torch_npu would misread it), where the
process already runs on restricted cores (taskset, cgroups: torch_npu then binds nothing
either), where the box's card count cannot be known, or with fewer cores than cards.

``TASK_QUEUE_ENABLE`` is never set (``2`` can raise peak NPU memory and NPUGraph capture refuses
it); its value in effect is reported with the advice.
"""

import os
import re

from ascend_shim.engine import versions
from ascend_shim.engine.patching import Patch
from ascend_shim.patches.torch_npu.alloc_conf import ENVIRONMENT

VARIABLE = "CPU_AFFINITY_CONF"
TASK_QUEUE = "TASK_QUEUE_ENABLE"
BOX = "ASCEND_SHIM_NPU_BOX"  # the box's card count, left by a process that saw every card
WRITTEN = "ASCEND_SHIM_CPU_AFFINITY_CONF"  # the value the shim wrote: a child that inherits it recomputes
VISIBLE = "ASCEND_RT_VISIBLE_DEVICES"

_decided: dict = {}  # what this process got: value, whose, why (for status and doctor)


def online_cores():
    """The host's online cores, as torch_npu counts them (sysconf _SC_NPROCESSORS_ONLN)."""
    try:
        return int(os.sysconf("SC_NPROCESSORS_ONLN"))
    except (AttributeError, ValueError, OSError):
        return 0


def allowed_cores():
    """The cores this process may run on (None where the platform cannot tell)."""
    try:
        return set(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return None


def device_files(folder="/dev"):
    """The box's cards as the Ascend driver's device files count them (``davinci0`` ...)."""
    try:
        names = os.listdir(folder)
    except OSError:
        return None
    count = sum(1 for name in names if re.fullmatch(r"davinci\d+", name))
    return count or None


def visible_cards(count, environ=None):
    """The physical ids of the ``count`` cards torch_npu sees, in its index order."""
    from ascend_shim.startup.visible_devices import parse

    env = os.environ if environ is None else environ
    if env.get(VISIBLE) is None:
        return list(range(count))
    cards, _ = parse(env[VISIBLE])
    ordered: list = []
    for card in cards:  # ACL reads ascending ids up to the first that is not
        if ordered and card <= ordered[-1]:
            break
        ordered.append(card)
    return ordered[:count]


def box_cards(environ=None, folder="/dev"):
    """(count, source) of the box's cards where this process sees only part of them."""
    env = os.environ if environ is None else environ
    value = env.get(BOX, "")
    if value.isdigit() and int(value) > 0:
        return int(value), "%s=%s, left by a process that saw every card" % (BOX, value)
    files = device_files(folder)
    if files:
        return files, "%d /dev/davinci* device files" % files
    return None, None


def share(card, box, cores):
    """(first, last) core of physical ``card``'s share: block ``card`` of ``cores // box``."""
    block = cores // box
    return card * block, card * block + block - 1


def plan(cards, box, cores):
    """The value for a process that sees physical ``cards`` of a ``box``-card host with ``cores``."""
    ranges = ["npu%d:%d-%d" % ((index,) + share(card, box, cores)) for index, card in enumerate(cards)]
    return ",".join(["1"] + ranges)


def _ranges_text(cards, box, cores):
    return ", ".join("card %d = npu:%d: cores %d-%d" % ((card, index) + share(card, box, cores))
                     for index, card in enumerate(cards))


# --- what torch_npu 2.12 reads from a value (NPUAffinityController.cpp: parseCPUAffinityConf) ---

def read_conf(value):
    """(mode, {index: cores or None}, problems): torch_npu's reading of ``value``; None cores: a
    range it skips. Problems are what torch_npu would misread or ignore."""
    problems = []
    ranges: dict = {}
    text = value.strip()
    mode = int(text) if text.isdigit() else None  # digits alone: the mode, nothing else is read
    for option in () if text.isdigit() else text.split(","):
        key, colon, rest = option.partition(":")
        if not colon:
            if option.isdigit() and mode is None:
                mode = int(option)
            elif not option.isdigit():
                problems.append("%r is neither a mode nor an option" % option)
            continue
        if key == "mode":
            if rest.isdigit() and mode is None:
                mode = int(rest)
            elif not rest.isdigit():
                problems.append("mode:%s is not a number" % rest)
            continue
        if re.fullmatch(r"npu\d{1,2}", key):
            first, dash, last = rest.partition("-")
            if rest.isdigit():
                ranges.setdefault(int(key[3:]), set()).add(int(rest))
            elif dash and first.isdigit() and last.isdigit():
                ranges.setdefault(int(key[3:]), set()).update(range(int(first), int(last) + 1))
            else:
                problems.append("%s:%s is not a core or a range a-b (torch_npu ignores it)" % (key, rest))
            continue
        if key not in ("npu_affine", "lazy_bind", "force"):
            problems.append("%r is not an option torch_npu knows (ignored)" % option)
    if mode is None:
        problems.append("it names no mode (0, 1 or 2 first): torch_npu binds nothing")
        mode = 0
    elif mode > 2:
        problems.append("mode %d is not documented (0, 1, 2): torch_npu 2.12 binds as in mode 2" % mode)
    return mode, ranges, problems


def misread(value, cards, cores):
    """What torch_npu would do with the user's ``value`` in a process that sees physical ``cards``
    that the user may not mean: malformed parts, ranges by index beyond the visible cards, and
    each visible card whose range torch_npu takes from the index this process sees."""
    mode, ranges, problems = read_conf(value)
    if mode == 0:
        return problems
    for index in sorted(ranges):
        if index >= len(cards):
            problems.append("npu%d: this process sees %d card(s), torch_npu ignores it" % (index, len(cards)))
        elif cores and max(ranges[index]) >= cores:
            problems.append("npu%d names cores past this host's %d" % (index, cores))
    if cards and cards != list(range(len(cards))) and cores:
        block = cores // len(cards)
        for index, card in enumerate(cards):
            if index not in ranges and block:
                problems.append(
                    "npu%d is physical card %d: without npu%d:a-b torch_npu gives it cores %d-%d (%d online "
                    "cores / %d visible card(s), block %d), by the index this process sees, not by card %d" % (
                        index, card, index, index * block, index * block + block - 1, cores, len(cards), index,
                        card))
    return problems


def task_queue(environ=None):
    """(value in effect, whose, problem) of TASK_QUEUE_ENABLE as torch_npu 2.12 reads it
    (OptionsManager::GetTaskQueueEnable: ASCEND_LAUNCH_BLOCKING=1 forces 0, strtol otherwise)."""
    env = os.environ if environ is None else environ
    raw = env.get(TASK_QUEUE)
    if env.get("ASCEND_LAUNCH_BLOCKING", "").strip() == "1":
        return 0, "ASCEND_LAUNCH_BLOCKING=1 turns the queue off", None
    if raw is None:
        return 1, "torch_npu's default", None
    found = re.match(r"\s*([+-]?\d+)", raw)
    number = int(found.group(1)) if found else 0
    if raw.strip() in ("0", "1", "2"):
        return number, "yours", None
    if number in (0, 1, 2):
        return number, "yours", "%s=%r is read as %d by torch_npu (strtol)" % (TASK_QUEUE, raw, number)
    return None, "yours", ("%s=%r: torch_npu refuses it at the first use of the card "
                           "(\"TASK_QUEUE_ENABLE should be 0, 1 or 2\")" % (TASK_QUEUE, raw))


TASK_QUEUE_ADVICE = ("2 moves workspace work to the second dispatch stage (torch_npu's advice for host-bound "
                     "work); not set by the shim: peak NPU memory may rise, and NPUGraph capture refuses it")


def _count():
    import torch

    return int(torch.npu.device_count())  # type: ignore[attr-defined]


def decide(environ=None, count=None, cores=None, allowed=None, folder="/dev"):
    """What this process's ``CPU_AFFINITY_CONF`` should be: (variables to set, note) or (None, why not).
    Records the decision for ``report``."""
    env = os.environ if environ is None else environ
    _decided.clear()
    count = _count() if count is None else count
    cores = online_cores() if cores is None else cores
    allowed = allowed_cores() if allowed is None else allowed
    cards = visible_cards(count, env)
    _decided.update(cards=cards, cores=cores)
    user = env.get(VARIABLE, "")
    if user.strip() and user != env.get(WRITTEN):
        problems = misread(user, cards, cores)
        _decided.update(whose="yours, kept", problems=problems)
        return None, "%s=%s is yours: kept%s" % (VARIABLE, user, "" if not problems else
                                                  " (torch_npu's reading: %s)" % "; ".join(problems))
    if not cards:
        return None, "torch_npu sees no card"
    if env.get(VISIBLE) is None:  # every card of the box: torch_npu's own ranges are the physical ones
        _decided.update(whose="unset: torch_npu binds nothing (its default)", box=count)
        return {BOX: str(count)}, ("this process sees every card (%d): %s left unset, torch_npu binds nothing; "
                                   "%s=%d for the processes it starts" % (count, VARIABLE, BOX, count))
    box, source = box_cards(env, folder)
    if box is None:
        why = "the box's card count is unknown here (no /dev/davinci*, no %s)" % BOX
    elif box <= len(cards):
        why = "this process sees every card of the box (%d)" % box
    elif max(cards) >= box:
        why = "card %d is not among the box's %d (%s)" % (max(cards), box, source)
    elif cores < box:
        why = "%d online cores for %d cards: no card has a share of its own" % (cores, box)
    elif allowed is not None and not set(range(cores)) <= allowed:
        why = "this process runs on restricted cores (%s; taskset or cgroups): left to them" % _cores_text(allowed)
    else:
        why = None
    if why:
        _decided.update(whose="unset (%s)" % why)
        return None, "%s not set: %s" % (VARIABLE, why)
    value = plan(cards, box, cores)
    _decided.update(whose="set by the shim", value=value, box=box,
                    why="%s of %d cores, box of %d cards from %s" % (_ranges_text(cards, box, cores), cores, box,
                                                                      source))
    return {VARIABLE: value, WRITTEN: value}, "%s=%s (%s)" % (VARIABLE, value, _decided["why"])


def _cores_text(cores):
    ordered = sorted(cores)
    runs, start = [], None
    for index, core in enumerate(ordered):
        if start is None:
            start = core
        if index + 1 == len(ordered) or ordered[index + 1] != core + 1:
            runs.append(str(start) if start == core else "%d-%d" % (start, core))
            start = None
    return ",".join(runs)


_plan: dict = {}


def guard(torch_npu):
    from ascend_shim.engine.npu import npu_reason

    why = npu_reason()
    if why:
        return why
    variables, note = decide()
    if variables is None:
        return note
    _plan.clear()
    _plan.update(variables=variables, note=note)
    return None


def apply(changes, torch_npu):
    for name, value in _plan["variables"].items():
        changes.assign(ENVIRONMENT, name, value)
    changes.note(_plan["note"])


def report():
    """What this process got (``host_dispatch``): the affinity value and whose it is, what torch_npu
    would misread in the user's value, TASK_QUEUE_ENABLE in effect."""
    queue, whose, problem = task_queue()
    decided = _decided
    if not decided:  # not decided in this process (no NPU, switched off): the variable as it is
        user = os.environ.get(VARIABLE)
        decided = {"whose": "yours" if user and user != os.environ.get(WRITTEN) else
                   "set by the shim in a parent process" if user else "unset"}
    section = {
        "cpu_affinity_conf": os.environ.get(VARIABLE),
        "cpu_affinity_whose": decided.get("whose"),
        "cpu_affinity_problems": list(decided.get("problems") or ()),
        "task_queue_enable": queue,
        "task_queue_whose": whose,
        "task_queue_problem": problem,
    }
    if decided.get("why"):
        section["cpu_affinity_why"] = decided["why"]
    return {"host_dispatch": section}


def lines(section):
    """``status``/``doctor`` words for a ``host_dispatch`` section."""
    if not section:
        return []
    value = section.get("cpu_affinity_conf")
    out = ["%s: %s" % (VARIABLE, "%s (%s)" % (value, section["cpu_affinity_whose"]) if value
                       else section["cpu_affinity_whose"])]
    if section.get("cpu_affinity_why"):
        out.append("  %s" % section["cpu_affinity_why"])
    out.extend("  torch_npu's reading: %s" % problem for problem in section.get("cpu_affinity_problems") or ())
    queue = section.get("task_queue_enable")
    out.append("%s: %s (%s)" % (TASK_QUEUE, "refused" if queue is None else queue, section.get("task_queue_whose")))
    if section.get("task_queue_problem"):
        out.append("  %s" % section["task_queue_problem"])
    if queue != 2:
        out.append("  %s" % TASK_QUEUE_ADVICE)
    return out


PATCH = Patch(
    name="cpu_affinity",
    target="torch_npu",
    summary="CPU_AFFINITY_CONF=1,npuN:<physical card's cores> where a process sees part of the box, unless set",
    guard=guard,
    apply=apply,
    version=versions.torch_npu,
    report=report,
)
