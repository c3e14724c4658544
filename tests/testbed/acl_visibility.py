"""Which cards ACL lets a process see: the bed's one reading of ASCEND_RT_VISIBLE_DEVICES.

CANN's envref (8.0 through 9.1): comma-separated physical card ids, ascending order only; reading
stops at the first entry that is not a digit string or names no card ("1,3,8" on 8 cards: 1 and
3). What ACL does with an id out of order is not documented beyond "only ascending is supported":
the bed refuses it as it refuses an invalid id, reading stops there ("3,1": card 3 alone), so a
value out of order never shows every card it names. A repeated id is out of order too.

Stdlib only: the fake torch_npu and the fake ``acl`` (CANN's Python binding, which Ray asks for
the card count) both read it.
"""

import os


def box_cards(environ=None):
    """The cards this simulated box holds (TESTBED_NPU_COUNT, default 1)."""
    return int((os.environ if environ is None else environ).get("TESTBED_NPU_COUNT", "1"))


def visible_cards(environ=None):
    """The physical cards ACL lets this process see, in index order."""
    env = os.environ if environ is None else environ
    count = box_cards(env)
    visible = env.get("ASCEND_RT_VISIBLE_DEVICES")
    if visible is None:
        return list(range(count))
    cards: list = []
    for entry in visible.split(","):
        if not (entry.isascii() and entry.isdigit()) or int(entry) >= count:
            break
        if cards and int(entry) <= cards[-1]:
            break
        cards.append(int(entry))
    return cards
