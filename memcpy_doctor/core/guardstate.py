"""Whether a device_guard mode is active in this thread.

Kept here, below both guards/ (which enters and leaves the modes) and tracer/ (which refuses to
start inside one), so that neither imports the other. Per thread, as torch's mode stack is.
"""

from __future__ import annotations

import threading


class _GuardDepth(threading.local):
    depth = 0  # device_guard modes now entered (guard blocks and guarded forwards)


GUARD_DEPTH = _GuardDepth()


def inside_guard() -> bool:
    """Whether a device_guard mode is active in this thread."""
    return GUARD_DEPTH.depth > 0
