"""Which NPU cards this process sees, and which of them ComfyUI computes on.

torch_npu obeys only ASCEND_RT_VISIBLE_DEVICES, and ACL accepts its card ids in ascending
order only (CANN's envref, 8.0 through 9.1); it reads ids up to the first entry that is not
one or names no card. ComfyUI's ``--default-device N`` and multi-instance launchers
(ComfyUI-Distributed starts worker i with ``CUDA_VISIBLE_DEVICES=i``) set the CUDA variable
alone, in an order of their own: CUDA computes on the first card named. ``carry_over`` runs
right before torch_npu executes in a ComfyUI process (after main.py set its variables,
before ACL reads them) and gives ACL the same cards, ascending. The first card named is the
*default card*: every thread ComfyUI asks for its device is bound to it
(``ascend_shim.engine.default_card``), as CUDA binds a fresh thread to its index 0.

- A value naming every id from 0 to 31 (``--default-device`` names 32) leaves every card
  visible: no Ascend server has more than 16, and ACL is then given no id the box lacks.
- A value the user set in ASCEND_RT_VISIBLE_DEVICES is kept, unless it is out of order:
  then ACL gets the same cards ascending, and the first one named is the default card.
- ``--cuda-device`` sets both variables to one card: nothing to do.
CUDA's reading of its variable: indices in order up to the first entry that is not one or
repeats one. A value that names no card leaves the NPU as it was, and says so in one line.

Stdlib only: this runs before torch is imported.
"""

import os
import sys

CUDA = "CUDA_VISIBLE_DEVICES"
ASCEND = "ASCEND_RT_VISIBLE_DEVICES"
EVERY_CARD = frozenset(range(32))  # what --default-device names: more than any Ascend server has

# What chose the cards in this process: variable, value (the user's), cards (ids as named),
# given (what ACL was given; None: every card), default (the card named first), index (its
# torch index among the visible cards), carried (whether the shim wrote ASCEND), count.
_choice: dict = {}


def parse(value):
    """(cards, problem): the card indices ``value`` names under CUDA's reading, and why the
    reading stopped early (None when every entry was read)."""
    if not value.strip():
        return [], "the value is empty"
    cards: list = []
    for entry in value.split(","):
        text = entry.strip()
        if not (text.isascii() and text.isdigit()):
            return cards, "%r is not a card index" % text
        card = int(text)
        if card in cards:
            return cards, "card %d is named twice" % card
        cards.append(card)
    return cards, None


def ascending(cards):
    return all(a < b for a, b in zip(cards, cards[1:]))


def _warn(text):
    from ascend_shim.startup.output import warn

    warn(text)


def _short(value):
    return value if len(value) <= 40 else value[:40] + "..."


def _joined(cards):
    return ",".join(str(card) for card in cards)


def _give(env, cards):
    """ACL gets ``cards`` in ascending order (or every card); the first named is the default."""
    default = cards[0]
    if EVERY_CARD <= set(cards):
        given = None
        env.pop(ASCEND, None)
        index = default
    else:
        ordered = sorted(cards)
        given = _joined(ordered)
        env[ASCEND] = given
        index = ordered.index(default)
    _choice.update(given=given, default=default, index=index, carried=True)


def carry_over(environ=None):
    """Give ACL, in ascending order, the cards CUDA_VISIBLE_DEVICES names where the user set the
    CUDA variable and not the Ascend one (or set the Ascend one out of order); record which card
    ComfyUI computes on. Never raises."""
    env = os.environ if environ is None else environ
    if _choice.get("carried") and env.get(ASCEND) == _choice["given"] and (
            _choice["variable"] == ASCEND or env.get(CUDA) == _choice["value"]):
        return  # carried already in this process (status, then an import of ComfyUI)
    _choice.clear()
    if ASCEND in env:
        _keep_or_order(env)
        return
    cuda = env.get(CUDA)
    if cuda is None:
        return
    cards, problem = parse(cuda)
    _choice.update(variable=CUDA, value=cuda, cards=cards, carried=False)
    if not cards:
        _warn("%s=%r names no card (%s): the NPU cards stay as they are; %s chooses NPU cards, "
              "--cpu computes on the CPU" % (CUDA, _short(cuda), problem, ASCEND))
        return
    _give(env, cards)
    if problem:
        _warn("%s=%r: %s, so the NPU gets cards %s (what CUDA reads)"
              % (CUDA, _short(cuda), problem, _short(_joined(cards))))


def _keep_or_order(env):
    """The user's own ASCEND_RT_VISIBLE_DEVICES: kept as ACL reads it, unless out of order."""
    value = env[ASCEND]
    cards, problem = parse(value)
    _choice.update(variable=ASCEND, value=value, cards=cards, carried=False)
    if len(cards) < 2 or ascending(cards):
        return  # ACL reads it as it is (ids up to the first that is not one: its documented rule)
    _give(env, cards)
    dropped = " (%s: ACL stops there too)" % problem if problem else ""
    _warn("%s=%s: ACL accepts card ids in ascending order only; the NPU gets %s and ComfyUI computes "
          "on card %d (npu:%d), the first you named%s"
          % (ASCEND, _short(value), env[ASCEND], cards[0], _choice["index"], dropped))


def after_import(count, environ=None):
    """torch_npu has executed and sees ``count`` cards (None: it did not import, no NPU stack
    here: the carried value is taken back, nothing is left for child processes). A default
    card this machine lacks, or no card at all, is said in one line."""
    env = os.environ if environ is None else environ
    if not _choice.get("carried"):
        return
    if count is None:
        if env.get(ASCEND) == _choice["given"]:
            if _choice["variable"] == ASCEND:
                env[ASCEND] = _choice["value"]  # the user's own value, as it was
            elif ASCEND in env:
                del env[ASCEND]
        _choice["carried"] = False
        return
    _choice["count"] = count
    variable, value = _choice["variable"], _short(_choice["value"])
    if count == 0:  # fewer than named is what CUDA does too (it stops at a card it lacks); none is not
        _warn("%s=%r names no card of this machine: torch_npu sees none (%s=%s); ComfyUI finds no NPU"
              % (variable, value, ASCEND, _short(env.get(ASCEND) or "")))
        return
    if _choice["index"] >= count:
        _warn("%s=%r%s: card %d, named first, is not on this machine (torch_npu sees %d card(s)); "
              "ComfyUI computes on npu:0" % (variable, value, _set_by(), _choice["default"], count))


def _set_by():
    """Where ComfyUI's own --default-device wrote the value: say so (the user typed the flag)."""
    cards = _choice.get("cards") or []
    if _choice.get("variable") == CUDA and len(cards) == len(EVERY_CARD) and set(cards) == EVERY_CARD:
        return " (set by --default-device %d)" % cards[0]
    return ""


def default_index():
    """The torch index of the card ComfyUI computes on where it is not npu:0, else None."""
    index = _choice.get("index")
    if not _choice.get("carried") or not index:
        return None
    count = _choice.get("count")
    return index if count is None or index < count else None


def describe(count):
    """What chose the ``count`` visible cards, for ``status``, ``doctor`` and the startup line."""
    variable = _choice.get("variable")
    if not _choice and ASCEND in os.environ:  # set before this process, carry_over never ran
        variable = ASCEND
        _choice.update(variable=ASCEND, value=os.environ[ASCEND], carried=False)
    if variable is None and CUDA in os.environ:
        return "all %d card(s) visible (torch_npu does not read %s=%s; %s unset)" % (
            count, CUDA, _short(os.environ[CUDA]), ASCEND)
    if variable is None:
        return "all %d card(s) visible (%s and %s unset)" % (count, ASCEND, CUDA)
    chosen = "chosen by %s=%s" % (variable, _short(_choice["value"]))
    if not _choice.get("carried"):
        if variable == ASCEND:
            return "%d card(s) visible, %s" % (count, chosen)
        return "all %d card(s) visible (%s=%s names no card; %s not set)" % (
            count, CUDA, _short(_choice["value"]), ASCEND)
    given, index = _choice["given"], _choice["index"]
    gave = "every card left visible" if given is None else "the NPU got %s=%s" % (ASCEND, _short(given))
    if index >= count:
        gave += ", card %d is not on this machine: ComfyUI computes on npu:0" % _choice["default"]
    elif index or given is None:
        gave += ", ComfyUI computes on card %d = npu:%d" % (_choice["default"], index)
    return "%d card(s) visible, %s: %s" % (count, chosen, gave)


def choice():
    """A copy of what chose the cards (empty: nothing was decided in this process)."""
    return dict(_choice)


def for_report():
    """``status`` and ``doctor`` see the cards ComfyUI would: the same carry-over, in their own
    process, where torch_npu has not executed yet."""
    if "torch_npu" not in sys.modules:
        carry_over()
