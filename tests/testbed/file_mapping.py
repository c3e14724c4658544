"""Whether a tensor's memory is a view of a file mapping (Linux ``/proc/self/maps``)."""

import os


def _mapping_of(address: int):
    with open("/proc/self/maps") as maps:
        for line in maps:
            parts = line.split(None, 5)
            lo, hi = (int(x, 16) for x in parts[0].split("-"))
            if lo <= address < hi:
                return parts[5].strip() if len(parts) > 5 else ""
    return None


def tensor_is_file_backed(t) -> bool:
    """True when ``t``'s storage lies in a mapping of a regular file, i.e. its
    pages fault in from disk on first touch."""
    name = _mapping_of(t.untyped_storage().data_ptr())
    return bool(name) and name.startswith("/") and os.path.isfile(name.split(" (deleted)")[0])
