"""Fake ``acl``, CANN's Python binding (pyACL), for the simulated Ascend machines.

On a box CANN's ``set_env.sh`` puts ``acl`` on the Python path; Ray's NPU support asks it how many
cards the process sees (``acl.rt.get_device_count()``, which honours ASCEND_RT_VISIBLE_DEVICES as
every ACL call does) and the SoC's name (``acl.get_soc_name()``). Only those two, with pyACL's
return conventions: ``(value, ret)`` with ``ret`` 0 for success, and a plain string.
"""

import os as _os
import types as _types

from testbed import acl_visibility as _visibility


def _get_device_count():
    return len(_visibility.visible_cards()), 0


def get_soc_name():
    return _os.environ.get("TESTBED_NPU_NAME", "Ascend910B3")


rt = _types.SimpleNamespace(get_device_count=_get_device_count)
