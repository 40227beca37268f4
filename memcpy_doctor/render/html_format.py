"""Figures and text as the HTML report writes them: escaped, with units a reader takes in at a
glance (render/html.py)."""

from __future__ import annotations

import html
import os

from ..core.paths import format_site
from ..core.units import binary_size as size  # (as the text report writes them)
from ..core.trace import Site


def esc(value: object) -> str:
    """Text from the trace (file, op and function names, source lines) made safe for HTML,
    in text and in attribute values alike."""
    return html.escape(str(value), quote=True)


def duration(ns: float) -> str:
    """A time in the unit that keeps it short: "850 ns", "62 µs", "1.25 ms", "3.4 s"."""
    if abs(ns) < 1e3:
        return f"{ns:.0f} ns"
    if abs(ns) < 1e6:
        return f"{ns / 1e3:.3g} µs"
    if abs(ns) < 1e9:
        return f"{ns / 1e6:.4g} ms"
    return f"{ns / 1e9:.4g} s"


def share(part: float, whole: float) -> str:
    """`part` as a percentage of `whole`, three significant digits ("38.3%"); "-" for none."""
    return f"{part / whole * 100:.3g}%" if whole else "-"


def site_text(site: Site | None, cwd: str | None) -> str:
    """`file:line` as the text report writes it (relative to `cwd` below it), escaped, with a
    break allowed after each `/` (a library's path is wider than its column)."""
    return esc(format_site(site, cwd, missing="-")).replace("/", "/<wbr>")


def short_site(site: Site | None) -> str:
    """`name.py:line`, the file's base name only: for labels in a picture."""
    return "-" if site is None else f"{os.path.basename(site.file)}:{site.line}"


__all__ = ["esc", "duration", "size", "share", "site_text", "short_site"]
