"""A minimal TOML writer for the plan's flat documents (no third-party dependency).

Supports top-level keys and one level of tables whose values are strings, booleans,
integers, floats (shortest round-trip repr) and lists of those. Read back with tomllib.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

__all__ = ["dumps"]


def _value(key: str, value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"{key}={value!r}: TOML plan files hold finite numbers only")
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)  # a valid TOML basic string
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_value(key, v) for v in value) + "]"
    raise TypeError(f"{key}: cannot write {type(value).__name__} to TOML")


def dumps(doc: Mapping[str, Any]) -> str:
    """TOML text of ``doc``: scalar keys first, then ``[table]`` sections for nested mappings."""
    lines = [f"{k} = {_value(k, v)}" for k, v in doc.items() if not isinstance(v, Mapping)]
    for name, table in doc.items():
        if isinstance(table, Mapping):
            if lines:
                lines.append("")
            lines.append(f"[{name}]")
            for k, v in table.items():
                if isinstance(v, Mapping):
                    raise TypeError(f"{name}.{k}: nested tables are not supported")
                lines.append(f"{k} = {_value(f'{name}.{k}', v)}")
    return "\n".join(lines) + "\n"
