"""Units shared by analysis, renderers and options: sizes read from text, figures written as
text."""

from __future__ import annotations

import re
from fractions import Fraction

_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
          "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}
_SIZE = re.compile(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*([a-z]*)\s*", re.IGNORECASE)


def parse_bytes(text: str) -> int:
    """A size such as "4GiB", "4 GiB", "512MiB", "4GB" (SI: 10**9) or "123" (bytes), in bytes.

    Units are case-insensitive; a fraction ("1.5GiB") is rounded down to a whole byte, the safe
    side for a memory budget.
    """
    if not isinstance(text, str):
        raise TypeError(f"a size must be a string, not {type(text).__name__}")
    match = _SIZE.fullmatch(text)
    unit = match and _UNITS.get(match.group(2).lower())
    if not unit:
        raise ValueError(f"cannot read {text!r} as a size in bytes: expected a number and "
                         f"one of the units B, KB, MB, GB, TB, KiB, MiB, GiB, TiB, e.g. '4GiB'")
    return int(Fraction(match.group(1)) * unit)


def binary_size(nbytes: int) -> str:
    """Bytes in binary units, one decimal, as the reports write them: "586.0 MiB", "320 B"."""
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if nbytes >= scale:
            return f"{nbytes / scale:.1f} {unit}"
    return f"{nbytes} B"


def format_value(kind: str, value: float) -> str:
    """A gate metric's value in its unit: "count", "bytes" (binary units), "time" (ns, shown
    in ms) or a ratio (shown as a percentage)."""
    if kind == "count":
        return str(int(value))
    if kind == "bytes":
        for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
            if value >= scale:
                return f"{value / scale:.4g} {unit}"
        return f"{int(value)} B"
    if kind == "time":
        return f"{value / 1e6:.4g} ms"
    return f"{value:.4%}"
