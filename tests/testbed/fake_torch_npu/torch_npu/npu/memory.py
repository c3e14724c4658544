"""Fake ``torch.npu.memory``."""

from .. import _testbed
from . import (  # noqa: F401  (re-exported like torch_npu.npu.memory)
    empty_cache,
    max_memory_allocated,
    max_memory_reserved,
    mem_get_info,
    memory_allocated,
    memory_reserved,
    memory_stats,
    memory_stats_as_nested_dict,
    memory_summary,
    reset_max_memory_allocated,
    reset_peak_memory_stats,
)


def _set_allocator_settings(settings: str) -> None:
    """Recorded only: the simulation has no caching allocator to configure."""
    if not isinstance(settings, str):
        raise TypeError(f"settings must be a str, got {type(settings).__name__}")
    _testbed.allocator_settings.append(settings)
    _testbed.counters["_set_allocator_settings"] += 1
