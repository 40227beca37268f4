"""The transfer log (`profile --log-transfers N`, read by `explain --log`): the run's first N
copies in program order, one record each, like Paddle's verbose operator log. A subscriber
of the run's event record (tracer/events.py); the copies after the first N are counted."""

from __future__ import annotations

from typing import Any

from ..core.trace import TransferRecord
from .events import COPY, KIND


class TransferLog:
    """The first `limit` copies; `dropped` counts the rest."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.dropped = 0
        self._logged: list[tuple[TransferRecord, Any]] = []  # with its PendingCopy

    def event(self, event: tuple, pending: Any) -> None:
        """One event of the run's record (tracer/events.py), and its aggregate."""
        if event[KIND] != COPY:
            return
        if len(self._logged) >= self.limit:
            self.dropped += 1
            return
        direction, sync, pinned, trigger, site, producer, _, non_blocking = pending.path
        self._logged.append((TransferRecord(
            seq=len(self._logged), direction=direction, sync=sync, pinned=pinned,
            trigger=trigger, bytes=pending.nbytes, shape=pending.shape, dtype=pending.dtype,
            site=site, producer=producer, consumer=None, non_blocking=non_blocking), pending))

    def records(self) -> list[TransferRecord]:
        """The logged copies, each with its consumer: call once the collector has finished
        (every copy's consumer is known then, or known to be none)."""
        for record, pending in self._logged:
            record.consumer = pending.agg.path[-1] if pending.agg is not None else None
        return [record for record, _ in self._logged]
