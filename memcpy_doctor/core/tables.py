"""A trace's tables as pandas DataFrames (`Trace.dataframes()`), for notebooks and scripts."""

from __future__ import annotations

from typing import Any


def dataframes(trace: Any) -> dict[str, Any]:
    """A Trace's tables as pandas DataFrames, units in the column names. Every table has its
    columns even when it has no rows. (No import of trace.py, which calls this.)"""
    import pandas as pd

    def site(prefix: str, st: Any) -> dict[str, Any]:
        return {f"{prefix}file": st.file if st else None,
                f"{prefix}line": st.line if st else None,
                f"{prefix}function": st.function if st else None}

    def ref(prefix: str, r: Any) -> dict[str, Any]:
        return {f"{prefix}op": r.op if r else None, f"{prefix}device": r.device if r else None,
                **site(prefix + "site_", r.site if r else None)}

    def table(rows: list[dict[str, Any]], columns: list[str]) -> Any:
        return pd.DataFrame(rows, columns=columns)

    site_cols = list(site("", None))
    return {
        "events": table([
            {"event": e.name, "calls": e.calls, "cpu_time_ns": e.cpu_ns,
             "gpu_time_ns": e.gpu_ns, "total_time_ns": e.total_ns, "min_time_ns": e.min_ns,
             "max_time_ns": e.max_ns} for e in trace.events],
            ["event", "calls", "cpu_time_ns", "gpu_time_ns", "total_time_ns", "min_time_ns",
             "max_time_ns"]),
        "ops": table([
            {"op": o.op, "device": o.device, **site("", o.site), "calls": o.calls,
             "host_time_ns": o.host_ns, "device_time_ns": o.device_ns} for o in trace.ops],
            ["op", "device", *site_cols, "calls", "host_time_ns", "device_time_ns"]),
        "copies": table([
            {"direction": c.direction, "sync": c.sync, "pinned": c.pinned,
             "trigger": c.trigger, "calls": c.calls, "bytes": c.bytes,
             "host_time_ns": c.host_ns, "device_time_ns": c.device_ns, **site("", c.site),
             **ref("producer_", c.producer), **ref("consumer_", c.consumer)}
            for c in trace.copies],
            ["direction", "sync", "pinned", "trigger", "calls", "bytes", "host_time_ns",
             "device_time_ns", *site_cols, *ref("producer_", None),
             *ref("consumer_", None)]),
        "waits": table([
            {"kind": w.kind, "calls": w.calls, "wait_time_ns": w.wait_ns, **site("", w.site)}
            for w in trace.waits], ["kind", "calls", "wait_time_ns", *site_cols]),
        "timeline": table([
            {"kind": e.kind, "ref": e.ref, "name": _event_name(trace, e.kind, e.ref),
             "thread": e.thread, "stream": e.stream, "host_start_ns": e.host_start_ns,
             "host_end_ns": e.host_end_ns, "device_start_ns": e.device_start_ns,
             "device_end_ns": e.device_end_ns, "reads": e.reads, "writes": e.writes}
            for e in (trace.timeline.events if trace.timeline is not None else [])],
            ["kind", "ref", "name", "thread", "stream", "host_start_ns", "host_end_ns",
             "device_start_ns", "device_end_ns", "reads", "writes"]),
    }


def _event_name(trace: Any, kind: str, ref: int) -> str:
    """What a timeline event is: its op, its copy's direction and trigger, its wait's kind."""
    if kind == "op":
        return trace.ops[ref].op
    if kind == "copy":
        copy = trace.copies[ref]
        return f"{copy.direction} {copy.trigger}"
    return trace.waits[ref].kind
