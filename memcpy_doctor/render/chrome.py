"""The run's timeline in the Chrome trace event format (chrome://tracing, Perfetto).

Host work on one process, device work on another (kernels and copies on separate threads),
flow arrows from the op that made a tensor to its copy and on to the op that read it.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the log comes from a run, which has imported the tracer and torch
    from ..tracer.chrome import ChromeLog

HOST, DEVICE = 0, 1
KERNELS, COPIES = 0, 1


def _us(ns: int) -> float:
    return ns / 1000.0


def render_chrome(log: ChromeLog, device_name: str, simulated: bool) -> str:
    events: list[dict[str, Any]] = [
        {"ph": "M", "name": "process_name", "pid": HOST, "args": {"name": "host"}},
        {"ph": "M", "name": "process_name", "pid": DEVICE,
         "args": {"name": f"{device_name}{' (simulated)' if simulated else ''}"}},
        {"ph": "M", "name": "thread_name", "pid": DEVICE, "tid": KERNELS,
         "args": {"name": "kernels"}},
        {"ph": "M", "name": "thread_name", "pid": DEVICE, "tid": COPIES,
         "args": {"name": "copies"}},
    ]
    for category, name, host_start, host_dur, dev_start, dev_dur, args in log.events:
        events.append({"ph": "X", "cat": category, "name": name, "pid": HOST, "tid": 0,
                       "ts": _us(host_start), "dur": _us(host_dur), "args": args})
        if dev_start is not None:
            events.append({"ph": "X", "cat": category, "name": name, "pid": DEVICE,
                           "tid": COPIES if category == "memcpy" else KERNELS,
                           "ts": _us(dev_start), "dur": _us(dev_dur), "args": args})
    for n, (src, dst) in enumerate(log.flows):
        s, d = log.events[src], log.events[dst]
        events.append({"ph": "s", "id": n, "cat": "dataflow", "name": "tensor", "pid": HOST,
                       "tid": 0, "ts": _us(s[2] + s[3])})
        events.append({"ph": "f", "bp": "e", "id": n, "cat": "dataflow", "name": "tensor",
                       "pid": HOST, "tid": 0, "ts": _us(d[2])})
    return json.dumps({"traceEvents": events, "displayTimeUnit": "ms",
                       "otherData": {"tool": "memcpy-doctor", "simulated": simulated,
                                     "device": device_name, "events_dropped": log.dropped}})
