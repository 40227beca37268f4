"""A trace as a notebook shows it (run/ipython.py registers it for `Trace` when the extension
is loaded): the HTML report (render/html.py) in an iframe of its own, so that the page's
styles stay inside it and the notebook around it is left as it was."""

from __future__ import annotations

import html

from ..core.trace import Trace
from .html import render_html

#: The iframe's height in CSS pixels; the page scrolls inside it.
FRAME_HEIGHT_PX = 720


def trace_html(trace: Trace, name: str = "trace") -> str:
    """One line of headline, then the whole report page in an iframe (`srcdoc`: nothing is
    fetched)."""
    s = trace.summary
    share = s.memcpy_sync.time_ns / s.total_ns if s.total_ns else 0.0
    head = (f"memcpy-doctor: {s.memcpy_sync.calls} sync copies, {share:.1%} of "
            f"{s.total_ns / 1e6:.6g} ms ({html.escape(trace.meta.device_name)}"
            f"{', simulated' if trace.meta.simulated else ''})")
    page = html.escape(render_html([trace], [name]), quote=True)
    return (f'<div class="memcpy-doctor"><p><strong>{head}</strong></p>'
            f'<iframe srcdoc="{page}" title="memcpy-doctor report" '
            f'style="width: 100%; height: {FRAME_HEIGHT_PX}px; border: 1px solid #d8dde6">'
            "</iframe></div>")
