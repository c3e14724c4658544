"""Configuration from the environment, read once, strictly.

Stdlib only (``os``): this runs at interpreter start. An unrecognised
value never breaks startup: it gets one warning naming the variable, the
accepted values and the default that is used instead.
"""

import os

from ascend_shim import OFF_VALUES

_TRUE = ("1", "true", "on", "yes", "y", "enable", "enabled")
_FALSE = OFF_VALUES

# name -> (accepted values shown to the user, default)
CHOICES = {
    "ASCEND_SHIM_MMAP": (("auto", "keep"), "auto"),
    "ASCEND_SHIM_INT8": (("auto", "shim", "upstream", "off"), "auto"),
    "ASCEND_SHIM_FP8": (("auto", "bf16", "int8", "off"), "auto"),
}

_cached = None


SHOWN_CHARS = 80  # of a variable's value echoed in a warning


def shorten(text, limit=SHOWN_CHARS):
    """``text``, cut to ``limit`` characters with the full length said."""
    text = str(text)
    if len(text) <= limit:
        return text
    return "%s... (%d characters)" % (text[:limit], len(text))


def _warn(text):
    from ascend_shim.startup.output import warn

    warn(text)


def warn_unknown_disable_names(names):
    """One short line for ASCEND_SHIM_DISABLE names no patch has (``status`` lists them)."""
    _warn("ASCEND_SHIM_DISABLE ignores unknown %s; `python -m ascend_shim status` lists the patches"
          % shorten(", ".join(names), 40))


def _flag(env, name, default):
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return default
    value = raw.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    _warn(
        "%s=%s is not recognised; accepted: %s (on) or %s (off); using the default (%s)"
        % (name, shorten(repr(raw)), "/".join(_TRUE), "/".join(_FALSE), "on" if default else "off")
    )
    return default


def _choice(env, name):
    accepted, default = CHOICES[name]
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return default
    value = raw.strip().lower()
    if value in accepted:
        return value
    _warn(
        "%s=%s is not recognised; accepted: %s; using the default (%s)"
        % (name, shorten(repr(raw)), ", ".join(accepted), default)
    )
    return default


def _names(env, name):
    raw = env.get(name, "")
    # patch names are lower case; the user's spelling need not be
    return frozenset(part.strip().lower() for part in raw.split(",") if part.strip())


class Config:
    """A snapshot of the ASCEND_SHIM* variables."""

    __slots__ = ("enabled", "disabled", "debug", "strict", "mmap", "int8", "fp8", "audit")

    def __init__(self, env):
        self.enabled = _flag(env, "ASCEND_SHIM", True)
        self.disabled = _names(env, "ASCEND_SHIM_DISABLE")
        self.debug = _flag(env, "ASCEND_SHIM_DEBUG", False)
        self.strict = _flag(env, "ASCEND_SHIM_STRICT", False)
        self.mmap = _choice(env, "ASCEND_SHIM_MMAP")
        self.int8 = _choice(env, "ASCEND_SHIM_INT8")
        self.fp8 = _choice(env, "ASCEND_SHIM_FP8")
        # per prompt: ops without an NPU kernel, ops outside torch_npu's dtype table (engine/audit.py)
        self.audit = _flag(env, "ASCEND_SHIM_AUDIT", False)

    def patch_disabled(self, name):
        return "*" in self.disabled or name in self.disabled

    def as_dict(self):
        return {
            "enabled": self.enabled,
            "disabled": sorted(self.disabled),
            "debug": self.debug,
            "strict": self.strict,
            "mmap": self.mmap,
            "int8": self.int8,
            "fp8": self.fp8,
            "audit": self.audit,
        }


def get():
    """The configuration of this process, parsed on first use."""
    global _cached
    if _cached is None:
        _cached = Config(os.environ)
    return _cached
