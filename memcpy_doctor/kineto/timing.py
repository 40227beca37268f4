"""The timings in a torch.profiler (Kineto) trace that a device profile is made of: each copy's
bytes and device time per path, the host's latencies where the trace shows them, and the
device's properties. `memcpy-doctor calibrate --from-trace` fits them (run/calibrate_trace.py).

Pure: events in (kineto/events.py records, or parsed dicts read into them), plain records out (the same `{"path", "bytes", "ns"}` copy records
live calibration measures), so the fit is tested on hand-made traces.

- copies: every `gpu_memcpy` event's `args.bytes` and `dur`, the DMA's own time on the device
  (what the cost model's `setup + bytes / bandwidth` stands for), per path `HtoD_pinned`,
  `HtoD_pageable`, `DtoH_pinned`, `DtoH_pageable`, and `DtoD` for a peer copy (`PtoP`); a copy
  within one device (`DtoD (Device -> Device)`) reads and writes device memory, so it measures
  the memory bandwidth instead;
- sync_ns: `cudaStreamSynchronize` / `cudaDeviceSynchronize` calls made while no device work
  was running: then the whole call is the wake-up latency the model adds to every wait;
- launch_call_ns: each `cudaLaunchKernel` call's duration; launch_ns: the host time of each
  innermost `cpu_op` that launched exactly one kernel and nothing else (dispatcher plus
  launch, as live calibration times `x.add_(1)`, but with the profiler's own cost per op);
  memcpy_call_ns: the `cudaMemcpyAsync` call of each pinned copy (which does not wait);
- kernel_min_ns: the shortest kernel.
"""

from __future__ import annotations

from bisect import bisect_left
from collections import Counter
from itertools import accumulate
from typing import Any

from .events import Event, as_events
from .stacks import enclosing

_SYNCS = ("cudaStreamSynchronize", "cudaDeviceSynchronize")
_LAUNCHES = ("cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel")
_DEVICE = ("kernel", "gpu_memcpy", "gpu_memset")


def copy_path(name: str) -> str | None:
    """The profile's copy path of a gpu_memcpy event's name; "local" for a copy within one
    device; None for one the model has no path for (HtoH)."""
    if "PtoP" in name:
        return "DtoD"
    if "DtoD" in name:
        return "local"
    for direction in ("HtoD", "DtoH"):
        if direction in name:
            return f"{direction}_{'pinned' if 'Pinned' in name else 'pageable'}"
    return None


def _ns(us: Any) -> int:
    return round(float(us) * 1000)


def timings(data: dict) -> dict[str, Any]:
    """The records `calibrate_trace.fit_trace` fits, from one parsed torch.profiler trace."""
    read = as_events(data.get("traceEvents", []))
    read.check()
    events = [e for e in read if e.ph == "X" or e.ph is None]
    copies, local = [], []
    pinned_calls: set[Any] = set()  # correlation ids of pinned copies
    kernels: list[int] = []
    busy: list[tuple[float, float]] = []  # device work: (start, end) in us
    for e in events:
        cat = e.cat
        if cat in _DEVICE:
            busy.append((e.ts, e.ts + e.dur))
        if cat == "kernel":
            kernels.append(_ns(e.dur))
        elif cat == "gpu_memcpy":
            path = copy_path(e.name if e.name is not None else "")
            nbytes = e.nbytes
            if path is None or type(nbytes) is not int or nbytes <= 0:
                continue
            record = {"path": path, "bytes": nbytes, "ns": _ns(e.dur)}
            (local if path == "local" else copies).append(record)
            if path.endswith("_pinned"):
                pinned_calls.add(e.corr)
    busy.sort()
    starts = [s for s, _ in busy]
    ends = list(accumulate((e for _, e in busy), max))  # the latest end so far
    sync_ns = []
    for e in events:
        if e.cat == "cuda_runtime" and e.name in _SYNCS:
            ts, end = e.ts, e.ts + e.dur
            i = bisect_left(starts, end)  # device work that started before the call ended
            if i == 0 or ends[i - 1] <= ts:  # ... all of it had ended when the call began
                sync_ns.append(_ns(e.dur))
    launch_ns, launch_call_ns = _launches(events)
    memcpy_call_ns = [_ns(e.dur) for e in events if e.cat == "cuda_runtime"
                      and e.corr in pinned_calls]
    return {"device": _device(data), "copies": copies, "local_copies": local,
            "sync_ns": sync_ns, "launch_ns": launch_ns, "launch_call_ns": launch_call_ns,
            "memcpy_call_ns": memcpy_call_ns, "kernel_ns": kernels}


def _launches(events: list[Event]) -> tuple[list[int], list[int]]:
    found = enclosing(events)
    calls: Counter[int] = Counter()
    launches: Counter[int] = Counter()
    ops: dict[int, Event] = {}
    launch_call_ns = []
    for e in events:
        if e.cat != "cuda_runtime":
            continue
        is_launch = e.name in _LAUNCHES
        if is_launch:
            launch_call_ns.append(_ns(e.dur))
        enclosing_ops = found.ops.get(id(e))
        if enclosing_ops:
            op = enclosing_ops[-1]
            ops[id(op)] = op
            calls[id(op)] += 1
            launches[id(op)] += is_launch
    launch_ns = [_ns(ops[k].dur) for k, n in calls.items() if n == 1 and launches[k]]
    return launch_ns, launch_call_ns


def _device(data: dict) -> dict[str, Any]:
    """What `deviceProperties` says of the first device, in the profile's terms."""
    props = data.get("deviceProperties")
    p = props[0] if isinstance(props, list) and props and isinstance(props[0], dict) else {}
    out: dict[str, Any] = {}
    if isinstance(p.get("name"), str):
        out["name"] = p["name"]
    if type(p.get("totalGlobalMem")) is int:
        out["total_memory_bytes"] = p["totalGlobalMem"]
    if type(p.get("computeMajor")) is int and type(p.get("computeMinor")) is int:
        out["compute_capability"] = [p["computeMajor"], p["computeMinor"]]
    if type(p.get("numSms")) is int:
        out["multi_processor_count"] = p["numSms"]
    return out
