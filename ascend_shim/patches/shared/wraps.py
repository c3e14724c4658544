"""Wrap a function of the module a patch was applied to, once per module object.

The wrapper is called as ``wrapper(module, wrapped, instance, args, kwargs)``
(``ascend_shim.engine.patching.bind``): it reads ComfyUI's state from the module it
was applied to, never from ``sys.modules``, which may hold another object by
the time it runs. Applying the same patch twice to one module object wraps
once; a fresh module object (re-import, reload) gets its own wrapper.
"""

from ascend_shim.engine.patching import bind

_TAG = "_self_ascend_shim"  # wrapt keeps ``_self_*`` attributes on the proxy itself


def _stored(owner, attribute):
    if isinstance(owner, type):
        return vars(owner).get(attribute)
    return getattr(owner, attribute, None)


def _tag_of(value):
    try:
        return object.__getattribute__(value, _TAG)  # this proxy's own, not one below it
    except AttributeError:
        return None


def wrap_function(changes, module, attribute, wrapper, owner=None):
    """Wrap ``owner.attribute`` (``owner`` defaults to ``module``); False if already done."""
    owner = module if owner is None else owner
    tag = "%s.%s" % (wrapper.__module__, wrapper.__qualname__)
    if _tag_of(_stored(owner, attribute)) == tag:
        return False
    replacement = changes.wrap(owner, attribute, bind(wrapper, module))
    setattr(replacement, _TAG, tag)
    return True
