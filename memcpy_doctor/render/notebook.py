"""A trace as a notebook shows it (`Trace._repr_html_`): the report, in HTML that sits inside
a notebook's output without styling anything around it."""

from __future__ import annotations

import html

from ..core.trace import Trace
from .text import render_text


def trace_html(trace: Trace) -> str:
    """The text report in a preformatted block, its headline above it."""
    s = trace.summary
    share = s.memcpy_sync.time_ns / s.total_ns if s.total_ns else 0.0
    head = (f"memcpy-doctor: {s.memcpy_sync.calls} sync copies, {share:.1%} of "
            f"{s.total_ns / 1e6:.6g} ms ({html.escape(trace.meta.device_name)}"
            f"{', simulated' if trace.meta.simulated else ''})")
    return (f'<div class="memcpy-doctor"><p><strong>{head}</strong></p>'
            f'<pre style="white-space: pre; overflow-x: auto">'
            f"{html.escape(render_text(trace))}</pre></div>")
