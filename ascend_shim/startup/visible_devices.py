"""Which NPU cards this process sees, when a launcher chose cards with CUDA_VISIBLE_DEVICES.

torch_npu obeys only ASCEND_RT_VISIBLE_DEVICES. ComfyUI's ``--default-device N`` and
multi-instance launchers (ComfyUI-Distributed starts each worker with
``CUDA_VISIBLE_DEVICES=i``) set the CUDA variable alone: every process saw all cards and
computed on card 0. ``carry_over`` runs right before torch_npu executes in a ComfyUI
process (after main.py set its variables, before ACL reads them) and gives the NPU the same
cards in the same order, unless the user set ASCEND_RT_VISIBLE_DEVICES (``--cuda-device``
sets both). CUDA's reading: indices in order up to the first entry that is not one or repeats
one. A value that names no card leaves the NPU as it was and says so in one line. ACL then
reads the carried value up to the first card the machine lacks (CANN envref).

Stdlib only: this runs before torch is imported.
"""

import os
import sys

CUDA = "CUDA_VISIBLE_DEVICES"
ASCEND = "ASCEND_RT_VISIBLE_DEVICES"

_choice: dict = {}  # what chose the cards in this process: variable, value, cards, carried


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


def _warn(text):
    from ascend_shim.startup.output import warn

    warn(text)


def _short(value):
    return value if len(value) <= 40 else value[:40] + "..."


def carry_over(environ=None):
    """Give ASCEND_RT_VISIBLE_DEVICES the cards CUDA_VISIBLE_DEVICES names, where the user set
    the CUDA variable and not the Ascend one; record what chose the cards. Never raises."""
    env = os.environ if environ is None else environ
    if _choice.get("carried") and env.get(ASCEND) == ",".join(str(c) for c in _choice["cards"]):
        return  # carried already in this process (status, then an import of ComfyUI)
    _choice.clear()
    if ASCEND in env:
        _choice.update(variable=ASCEND, value=env[ASCEND], carried=False)
        return
    cuda = env.get(CUDA)
    if cuda is None:
        return
    cards, problem = parse(cuda)
    _choice.update(variable=CUDA, value=cuda, cards=cards, carried=bool(cards))
    if not cards:
        _warn("%s=%r names no card (%s): the NPU cards stay as they are; %s chooses NPU cards, "
              "--cpu computes on the CPU" % (CUDA, _short(cuda), problem, ASCEND))
        return
    env[ASCEND] = ",".join(str(card) for card in cards)
    if problem:
        _warn("%s=%r: %s, so the NPU gets cards %s (what CUDA reads)"
              % (CUDA, _short(cuda), problem, _short(env[ASCEND])))


def after_import(count, environ=None):
    """torch_npu has executed and sees ``count`` cards (None: it did not import, no NPU stack
    here: the carried value is taken back, nothing is left for child processes). No card at
    all is said in one line."""
    env = os.environ if environ is None else environ
    if not _choice.get("carried"):
        return
    carried = env.get(ASCEND)
    if count is None:
        if carried == ",".join(str(c) for c in _choice["cards"]):
            del env[ASCEND]
        _choice["carried"] = False
        return
    _choice["count"] = count
    if count == 0:  # fewer than named is what CUDA does too (it stops at a card it lacks); none is not
        _warn("%s=%r names no card of this machine: torch_npu sees none (%s=%s); ComfyUI finds no NPU"
              % (CUDA, _short(_choice["value"]), ASCEND, _short(carried or "")))


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
    if variable == ASCEND:
        return "%d card(s) visible, chosen by %s=%s" % (count, ASCEND, _short(_choice["value"]))
    if _choice.get("carried"):
        return "%d card(s) visible, chosen by %s=%s (carried to %s)" % (
            count, CUDA, _short(_choice["value"]), ASCEND)
    return "all %d card(s) visible (%s=%s names no card; %s not set)" % (
        count, CUDA, _short(_choice["value"]), ASCEND)


def choice():
    """A copy of what chose the cards (empty: nothing was decided in this process)."""
    return dict(_choice)


def for_report():
    """``status`` and ``doctor`` see the cards ComfyUI would: the same carry-over, in their own
    process, where torch_npu has not executed yet."""
    if "torch_npu" not in sys.modules:
        carry_over()
