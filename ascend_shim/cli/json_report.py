"""The one writer of ``--json`` reports: strict JSON that every parser accepts.

``json.dumps`` writes NaN and infinities as the bare words ``NaN`` and
``Infinity``, which strict parsers (``jq``, JavaScript, ``json.loads`` with
``parse_constant``) reject. Such a number becomes ``null`` here, and the
reason sits beside it: ``"cosine": null, "cosine_not_finite": "nan"``; in a
list the item is ``null`` and the list's key gets ``<key>_not_finite``,
a map from item index to ``"nan"``, ``"inf"`` or ``"-inf"``.
"""

import json
import math
from typing import Any, Dict, Optional

SUFFIX = "_not_finite"


def _kind(value: float) -> str:
    return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")


def _non_finite(value: Any) -> Optional[str]:
    # bool is an int, never a float; numpy/torch scalars go through default=str
    if isinstance(value, float) and not math.isfinite(value):
        return _kind(value)
    return None


def finite(data: Any) -> Any:
    """``data`` with every non-finite float replaced by None, the reason beside it."""
    if isinstance(data, dict):
        out: Dict[Any, Any] = {}
        for key, value in data.items():
            kind = _non_finite(value)
            if kind is not None:
                out[key] = None
                out["%s%s" % (key, SUFFIX)] = kind
                continue
            if isinstance(value, (list, tuple)):
                kinds = {str(i): k for i, k in ((i, _non_finite(v)) for i, v in enumerate(value)) if k}
                if kinds:
                    out["%s%s" % (key, SUFFIX)] = kinds
            out[key] = finite(value)
        return out
    if isinstance(data, (list, tuple)):
        return [None if _non_finite(v) else finite(v) for v in data]
    return data


def dumps(data: Any, sort_keys: bool = False) -> str:
    """Strict JSON text of ``data`` (objects JSON lacks are written as ``str()``)."""
    return json.dumps(finite(data), indent=2, sort_keys=sort_keys, default=str, allow_nan=False)


def emit(data: Any, sort_keys: bool = False) -> None:
    """Print ``data`` as the command's report on stdout."""
    print(dumps(data, sort_keys=sort_keys))
