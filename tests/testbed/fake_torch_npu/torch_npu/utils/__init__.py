"""Fake ``torch_npu.utils``."""

from . import collect_env  # noqa: F401
