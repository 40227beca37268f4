"""The timings in a torch.profiler (Kineto) trace that a device profile is made of: each copy's
bytes and device time per path, the host's latencies where the trace shows them, and the
device's properties. `memcpy-doctor calibrate --from-trace` fits them (run/calibrate_trace.py).

Events in (kineto/events.py's store, or parsed dicts read into one), plain records out (the
same `{"path", "bytes", "ns"}` copy records live calibration measures), so the fit is tested
on hand-made traces.

- copies: every `gpu_memcpy` event's `args.bytes` and `dur`, the DMA's own time on the device
  (what the cost model's `setup + bytes / bandwidth` stands for), per path `HtoD_pinned`,
  `HtoD_pageable`, `DtoH_pinned`, `DtoH_pageable`, `DtoD` for a peer copy between two GPUs
  (`PtoP`), the profile's DtoD path, and `DtoD_local` for a copy within one device
  (`DtoD (Device -> Device)`), which the model prices as a kernel that reads and writes
  device memory: it measures the memory bandwidth instead;
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
from itertools import accumulate
from typing import Any

from .events import KERNEL, RUNTIME, Events, as_events
from .stacks import enclosing

_SYNCS = ("cudaStreamSynchronize", "cudaDeviceSynchronize")
_LAUNCHES = ("cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel")
_DEVICE = ("kernel", "gpu_memcpy", "gpu_memset")
#: The path of a copy within one device: not one of the profile's copy paths (its DtoD is a
#: peer copy between GPUs); the model prices such a copy as a kernel (run/calibrate_trace.py).
LOCAL = "DtoD_local"


def copy_path(name: str) -> str | None:
    """The copy path of a gpu_memcpy event's name: the profile's, or LOCAL for a copy within
    one device; None for one the model has no path for (HtoH)."""
    if "PtoP" in name:
        return "DtoD"
    if "DtoD" in name:
        return LOCAL
    for direction in ("HtoD", "DtoH"):
        if direction in name:
            return f"{direction}_{'pinned' if 'Pinned' in name else 'pageable'}"
    return None


def _ns(us: Any) -> int:
    return round(float(us) * 1000)


def timings(data: dict) -> dict[str, Any]:
    """The records `calibrate_trace.fit_trace` fits, from one parsed torch.profiler trace."""
    events = as_events(data.get("traceEvents", []))
    events.check()
    spans = "(ph = 'X' OR ph IS NULL)"
    copies: list[dict[str, Any]] = []
    pinned_calls: set[Any] = set()  # correlation ids of pinned copies
    kernels: list[int] = []
    busy: list[tuple[float, float]] = []  # device work: (start, end) in us
    for e in events.records(f"k >= {KERNEL} AND {spans}"):
        cat = e.cat
        busy.append((e.ts, e.ts + e.dur))
        if cat == "kernel":
            kernels.append(_ns(e.dur))
        elif cat == "gpu_memcpy":
            path = copy_path(e.name if e.name is not None else "")
            nbytes = e.nbytes
            if path is None or type(nbytes) is not int or nbytes <= 0:
                continue
            copies.append({"path": path, "bytes": nbytes, "ns": _ns(e.dur)})
            if path.endswith("_pinned"):
                pinned_calls.add(e.corr)
    busy.sort()
    starts = [s for s, _ in busy]
    ends = list(accumulate((e for _, e in busy), max))  # the latest end so far
    sync_ns = []
    syncs = [events.name_id(n) for n in _SYNCS]
    for ts, dur, ns in events.query(
            f"SELECT ts, dur, ns FROM ev WHERE k = {RUNTIME} AND {spans} AND name IN (?, ?) "
            "ORDER BY id", syncs):
        i = bisect_left(starts, ts + dur)  # device work that started before the call ended
        if i == 0 or ends[i - 1] <= ts:  # ... all of it had ended when the call began
            sync_ns.append(ns)
    launch_ns, launch_call_ns = _launches(events, spans)
    memcpy_call_ns = [ns for corr, ns in events.query(
        f"SELECT corr, ns FROM ev WHERE k = {RUNTIME} AND {spans} ORDER BY id")
        if corr in pinned_calls]
    return {"device": _device(data), "copies": copies, "sync_ns": sync_ns, "launch_ns": launch_ns, "launch_call_ns": launch_call_ns,
            "memcpy_call_ns": memcpy_call_ns, "kernel_ns": kernels}


def _launches(events: Events, spans: str) -> tuple[list[int], list[int]]:
    """The host time of each innermost cpu_op whose one runtime call launched a kernel (the
    calls `enclosing` linked: those with spans), and each launch call's own duration."""
    enclosing(events)
    launches = [events.name_id(n) for n in _LAUNCHES]
    marks = ", ".join("?" * len(launches))
    launch_call_ns = [ns for (ns,) in events.query(
        f"SELECT ns FROM ev WHERE k = {RUNTIME} AND {spans} AND name IN ({marks}) "
        "ORDER BY id", launches)]
    launch_ns = [ns for (ns,) in events.query(
        f"SELECT op.ns FROM ev AS call JOIN link ON link.id = call.id JOIN ev AS op ON "
        f"op.id = link.op WHERE call.k = {RUNTIME} GROUP BY link.op HAVING count(*) = 1 AND "
        f"sum(call.name IN ({marks})) = 1 ORDER BY min(call.id)", launches)]
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
