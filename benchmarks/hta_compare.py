"""Side by side: what HolisticTraceAnalysis (HTA 0.5) and memcpy-doctor report on the same
torch.profiler (Kineto) traces, against the raw `gpu_memcpy` events, with the time and the
memory each takes. docs/kineto.md's HTA section is made from its output.

    python benchmarks/hta_compare.py [TRACE.json.gz ...] [--hta-python /work/htavenv/bin/python]
                                     [--repeat 3] [--include-last-step] [--shift-ts 0.5]
                                     [--drop-copy-launches] [--json OUT.json]

Default traces: ../shared/kineto/*.json.gz (HTA's own test data). HTA lives in a venv of its
own, so that it does not touch ours (its pandas and plotly pins):

    python3 -m venv /work/htavenv && /work/htavenv/bin/pip install torch==2.13.0 \\
        && /work/htavenv/bin/pip install HolisticTraceAnalysis==0.5.0 "pandas<3"

(pandas<3: HTA 0.5 leaves pandas unpinned, and under pandas 3 its critical_path_analysis
raises "Cannot specify both 'axis' and 'index'/'columns'"; every other figure is the same
under pandas 3.1.1 and 2.3.3.)

For each trace, each in a SEPARATE subprocess, timed (wall) with its peak RSS (os.wait4):
  raw   this script under our Python: counts the trace's gpu_memcpy events by name (count,
        bytes, sum of dur), the sync calls, and recomputes HTA's idle-time rule from the
        events (`rule_idle` below) as a check that the rule is described exactly;
  hta   this script under --hta-python: TraceAnalysis(trace_dir=a temp folder holding only
        the trace), then get_memory_bw_summary, get_gpu_kernel_breakdown(include_memory_
        kernels=True), get_idle_time_breakdown, get_temporal_breakdown,
        get_cuda_kernel_launch_stats, critical_path_analysis (first ProfilerStep: its sync
        edges), and the memcpy rows HTA keeps in its DataFrame;
  md    `memcpy-doctor import TRACE -o X.json` (X.json read back: copies, waits) and
        `memcpy-doctor report TRACE`.
Wall and CPU times are the median of --repeat runs; peak RSS the largest. Durations in us.

--include-last-step passes include_last_profiler_step=True to HTA (by default HTA drops the
last ProfilerStep). --shift-ts F and --drop-copy-launches run all three on a DERIVED copy of
each trace: every ts + F us written as a float, as recent torch writes ns-resolution traces
(torch 2.13: "ts": 5724737629055.295; HTA then rounds each event to whole us); or without the
cudaMemcpy* runtime calls (and their flows) of the copies, as when the launching thread was
not traced.
"""

from __future__ import annotations

import argparse
import bisect
import gzip
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_TRACES = sorted((ROOT.parent / "shared" / "kineto").glob("*.json.gz"))
GPU_CATS = ("kernel", "gpu_memset", "gpu_memcpy")
SYNC_CALLS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize")
KERNEL_WAIT_US = 30  # HTA's consecutive_kernel_delay default (trace units: us)


def load_events(path: str) -> dict:
    with (gzip.open if path.endswith(".gz") else open)(path, "rt") as f:
        return json.load(f)


def copy_kind(name: str) -> str:
    """'Memcpy HtoD (Pinned -> Device)' -> 'HtoD pinned'; DtoD has no host side."""
    direction = name.split()[1] if name.startswith("Memcpy ") else "?"
    if direction == "DtoD":
        return "DtoD"
    return f"{direction} {'pinned' if 'Pinned' in name else 'pageable'}"


def stream_of(e: dict) -> int:
    try:
        return int(e.get("args", {}).get("stream", -1))
    except (TypeError, ValueError):
        return -1


# ---------------------------------------------------------------- child: raw events
def rule_idle(events: list, include_last: bool) -> dict:
    """HTA 0.5's get_idle_time_breakdown, recomputed from the raw events (see docs/kineto.md):
    per stream, the gap before each GPU op (kernel, memcpy, memset; not cuda_sync) is
    ts - previous op's end; host_wait if the op's runtime call started after that end,
    else kernel_wait if the gap < 30 us, else other. HTA first rounds float timestamps
    (ts up, end down) and, with >= 2 ProfilerSteps, drops ops launched in the last one.
    Also: the host-wait gaps in which a sync call (cudaStream/Device/EventSynchronize,
    cudaMemcpy) returned, i.e. the GPU idle that follows a sync, in HTA's terms."""
    kept = [e for e in events if e.get("dur") is not None and e.get("cat") not in (None, "Trace")]
    for e in kept:  # common/trace_parser.py: round_down_time_stamps
        end = math.floor(e["ts"] + e["dur"])
        e["_ts"] = math.ceil(e["ts"])
        e["_end"] = end
    first = kept[0] if kept and kept[0] is events[0] else None  # HTA's row index 0
    corr = lambda e: e.get("args", {}).get("correlation", -1)  # noqa: E731
    gpu = [e for e in kept if e["cat"] in GPU_CATS and stream_of(e) != -1]
    host = {corr(e): e for e in kept if not (stream_of(e) >= 0 and corr(e) >= 0)}
    steps = [e for e in kept if "ProfilerStep" in e.get("name", "")]
    if len({e["name"] for e in steps}) > 1:  # common/trace.py: _filter_irrelevant_gpu_kernels
        if include_last:
            limit = max(e["_end"] for e in steps)
            gpu = [e for e in gpu if corr(e) in host and host[corr(e)]["_ts"] <= limit]
        else:
            limit = max(e["_ts"] for e in steps)
            gpu = [e for e in gpu if corr(e) in host and host[corr(e)]["_ts"] < limit]
        first = None if first is None or first["_ts"] >= limit else first
    syncs = sorted(e["_end"] for e in kept if e["cat"] == "cuda_runtime"
                   and (e["name"] in SYNC_CALLS or e["name"] == "cudaMemcpy"))
    out: dict = defaultdict(lambda: {"host_wait": 0, "kernel_wait": 0, "other": 0,
                                     "after_sync": 0, "after_sync_gaps": 0})
    by_stream = defaultdict(list)
    for e in gpu:
        by_stream[stream_of(e)].append(e)
    for stream, ops in by_stream.items():
        ops.sort(key=lambda e: e["_ts"])
        out[stream]  # a stream with one op still has a row
        for prev, op in zip(ops, ops[1:]):
            gap = op["_ts"] - prev["_end"]
            launch = host.get(corr(op), first)  # no runtime call: HTA joins row 0
            if launch is not None and launch["_ts"] > prev["_end"]:
                out[stream]["host_wait"] += gap
                i = bisect.bisect_left(syncs, prev["_end"])  # a sync returned in the gap
                if i < len(syncs) and syncs[i] <= launch["_ts"]:
                    out[stream]["after_sync"] += gap
                    out[stream]["after_sync_gaps"] += 1
            elif gap < KERNEL_WAIT_US:
                out[stream]["kernel_wait"] += gap
            else:
                out[stream]["other"] += gap
    return {str(s): v for s, v in out.items()}


def child_raw(path: str, include_last: bool) -> dict:
    d = load_events(path)
    events = d["traceEvents"]
    runtime = {e["args"].get("correlation"): e for e in events
               if e.get("cat") == "cuda_runtime" and "args" in e}
    copies: dict = defaultdict(lambda: {"count": 0, "bytes": 0, "dur": 0.0, "bw": []})
    unlaunched = 0
    for e in events:
        if e.get("cat") != "gpu_memcpy":
            continue
        r = copies[e["name"]]
        r["count"] += 1
        r["bytes"] += e["args"].get("bytes", 0)
        r["dur"] += e["dur"]
        if "memory bandwidth (GB/s)" in e["args"]:
            r["bw"].append(e["args"]["memory bandwidth (GB/s)"])
        unlaunched += e["args"].get("correlation") not in runtime
    syncs: dict = defaultdict(lambda: {"calls": 0, "dur": 0.0})
    for e in runtime.values():
        if e["name"] in SYNC_CALLS or e["name"].startswith("cudaMemcpy"):
            syncs[e["name"]]["calls"] += 1
            syncs[e["name"]]["dur"] += e["dur"]
    timed = [e for e in events if e.get("ph") == "X" and e.get("cat") != "Trace"]
    return {
        "copies": copies, "runtime": syncs, "copies_without_runtime_call": unlaunched,
        "profiler_steps": sorted({e["name"] for e in events
                                  if e.get("name", "").startswith("ProfilerStep")}),
        "float_ts": sum(isinstance(e.get("ts"), float) for e in events),
        "span_us": max(e["ts"] + e.get("dur", 0) for e in timed) - min(e["ts"] for e in timed),
        "all_span_us": max(e["ts"] + e.get("dur", 0) for e in events if "ts" in e)
        - min(e["ts"] for e in events if "ts" in e),  # M, i and Trace events too
        "events": len(events), "file_bytes": os.path.getsize(path),
        "rule_idle": rule_idle(events, include_last),
    }


# ---------------------------------------------------------------- child: HTA
def child_hta(path: str, include_last: bool) -> dict:
    t0 = time.perf_counter()
    import logging

    import pandas as pd
    from hta.configs.config import logger
    from hta.trace_analysis import TraceAnalysis
    from hta import __version__ as hta_version
    logger.setLevel(logging.ERROR)
    out: dict = {"phases_s": {"import": time.perf_counter() - t0}}

    def timed(name, fn):
        t = time.perf_counter()
        result = fn()
        out["phases_s"][name] = time.perf_counter() - t
        return result

    with tempfile.TemporaryDirectory() as tmp:
        shutil.copy(path, os.path.join(tmp, "rank0" + ("".join(Path(path).suffixes[-2:]))))
        ta = timed("load", lambda: TraceAnalysis(trace_dir=tmp,
                                                 include_last_profiler_step=include_last))
    rank = ta.t.get_ranks()[0]
    df = ta.t.get_trace(rank)
    names = ta.t.symbol_table.get_sym_table()
    name = df["name"].map(lambda i: names[i])
    cat = df["cat"].map(lambda i: names[i])
    memcpy = df[cat == "gpu_memcpy"]
    out["dataframe_copies"] = defaultdict(lambda: {"count": 0, "bytes": 0, "dur": 0.0, "zero_dur": 0})
    for n, nbytes, dur in zip(name[cat == "gpu_memcpy"], memcpy["bytes"], memcpy["dur"]):
        r = out["dataframe_copies"][n]
        r["count"], r["bytes"], r["dur"] = r["count"] + 1, r["bytes"] + int(nbytes), r["dur"] + float(dur)
        r["zero_dur"] += int(dur <= 0)
    out["profiler_steps"] = [int(s) for s in ta.get_profiler_steps()]
    sync_rows = df[(cat == "cuda_sync") & df["stream"].ne(-1)]
    out["cuda_sync_rows_as_gpu_busy"] = {"count": int(len(sync_rows)),
                                        "dur": float(sync_rows["dur"].sum())}

    bw = timed("memory_bw_summary", lambda: ta.get_memory_bw_summary(ranks=[rank]))
    out["memory_bw"] = {} if bw is None or bw.empty else {  # empty: no Kineto bandwidth args
        n: {k: float(bw.loc[(rank, n), ("memory_bw_gbps", k)]) for k in ("count", "mean", "min", "max")}
        for n in bw.index.get_level_values("name")}
    _, kernels = timed("gpu_kernel_breakdown", lambda: ta.get_gpu_kernel_breakdown(
        visualize=False, include_memory_kernels=True))
    mem = kernels[kernels["kernel_type"] == "MEMORY"]
    out["kernel_breakdown"] = {
        r["name"]: {"sum": float(r["sum (us)"]), "mean": float(r["mean (us)"]),
                    "count": round(r["sum (us)"] / r["mean (us)"]) if r["mean (us)"] else 0,
                    "min": float(r["min (us)"])} for _, r in mem.iterrows()}
    idle, stats = timed("idle_time_breakdown", lambda: ta.get_idle_time_breakdown(
        ranks=[rank], visualize=False, show_idle_interval_stats=True))
    out["idle"] = defaultdict(dict)
    for _, r in idle.iterrows():
        out["idle"][str(int(r["stream"]))][r["idle_category"]] = float(r["idle_time"])
    out["idle_gaps"] = {c: int(stats.loc[[c], "count"].sum()) for c in set(stats.index)}
    tb = timed("temporal_breakdown", lambda: ta.get_temporal_breakdown(visualize=False))
    out["temporal"] = {k: float(tb.iloc[0][k]) for k in tb.columns if k != "rank"}
    sync_id = ta.t.symbol_table.get_sym_id_map().get("cuda_sync")
    if sync_id is not None:  # the same breakdown with the cuda_sync rows taken out
        full = ta.t.traces[rank]
        ta.t.traces[rank] = full[full["cat"] != sync_id]
        tb = ta.get_temporal_breakdown(visualize=False)
        ta.t.traces[rank] = full
        out["temporal_without_cuda_sync"] = {k: float(tb.iloc[0][k]) for k in tb.columns}
    launch = timed("cuda_kernel_launch_stats", lambda: ta.get_cuda_kernel_launch_stats(
        ranks=[rank], visualize=False))[rank]
    on_copy = launch[launch["correlation"].isin(memcpy["correlation"])]
    out["launch_stats"] = {"rows": int(len(launch)), "copy_rows": int(len(on_copy)), **{
        f"copy_{k}": float(on_copy[k].sum()) for k in ("cpu_duration", "gpu_duration", "launch_delay")}}
    out["critical_path"] = critical_path(ta, rank, timed)
    out["versions"] = {"pandas": pd.__version__, "hta": hta_version}
    return out


def critical_path(ta, rank: int, timed) -> dict:
    """HTA's only analysis that reads the cuda_sync events: critical_path_analysis on the first
    ProfilerStep. Its sync edges (Stream/Event/Context Sync, GPU op -> end of the sync call)
    are dependencies of weight 0: the time is on the CPU's and GPU's own edges."""
    if not ta.get_profiler_steps():
        return {"skipped": "no ProfilerStep"}
    try:
        cp, ok = timed("critical_path_analysis",
                       lambda: ta.critical_path_analysis(rank, "ProfilerStep", 0))
    except Exception as e:  # HTA 0.5's CPA raises under pandas 3
        return {"error": f"{type(e).__name__}: {e}"}
    edges = [d["object"] for _, _, d in cp.edges(data=True)]
    sync = [e for e in edges if e.type.name == "SYNC_DEPENDENCY"]
    return {"ok": bool(ok), "sync_edges": len(sync), "sync_weight": sum(e.weight for e in sync),
            "sync_on_path": sum(e in cp.critical_path_edges_set for e in sync),
            "bound_by_pct": {k or "none": round(float(v), 1) for k, v in cp.summary().items()}}


# ---------------------------------------------------------------- parent
def run_child(cmd: list) -> tuple[float, float, float]:
    """Run cmd; return its wall seconds, its CPU seconds and its peak RSS in MiB."""
    with tempfile.TemporaryFile() as err:
        t = time.perf_counter()
        p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err)
        _, status, usage = os.wait4(p.pid, 0)
        wall = time.perf_counter() - t
        p.returncode = os.waitstatus_to_exitcode(status)  # reaped here, not by Popen
        if p.returncode:
            err.seek(0)
            raise SystemExit(f"failed ({p.returncode}): {' '.join(cmd)}\n"
                             + err.read().decode(errors="replace")[-3000:])
    return wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024


def measure(cmd: list, repeat: int) -> dict:
    runs = [run_child(cmd) for _ in range(repeat)]
    return {"wall_s": statistics.median(r[0] for r in runs), "cpu_s": statistics.median(
        r[1] for r in runs), "peak_rss_mib": max(r[2] for r in runs), "command": " ".join(cmd)}


def derive(path: Path, tmp: str, shift: float | None, drop_launches: bool) -> Path:
    d = load_events(str(path))
    ev = d["traceEvents"]
    if drop_launches:
        corrs = {e["args"].get("correlation") for e in ev if e.get("cat") == "gpu_memcpy"}
        ev = [e for e in ev if not (
            (e.get("cat") == "cuda_runtime" and e.get("args", {}).get("correlation") in corrs)
            or (e.get("cat") == "ac2g" and e.get("id") in corrs))]
    if shift is not None:
        for e in ev:
            if isinstance(e.get("ts"), (int, float)):
                e["ts"] = float(e["ts"]) + shift
    d["traceEvents"] = ev
    out = Path(tmp) / path.name
    with gzip.open(out, "wt") as f:
        json.dump(d, f)
    return out


def md_figures(path: str) -> dict:
    d = json.loads(Path(path).read_text())
    kinds: dict = defaultdict(lambda: defaultdict(float))
    for c in d["copies"]:
        kind = "DtoD" if c["direction"] == "DtoD" else \
            f"{c['direction']} {'pinned' if c.get('pinned') else 'pageable'}"
        k = kinds[kind]
        for f in ("calls", "bytes", "device_ns", "host_ns"):
            k[f] += c.get(f) or 0
        k["sync_calls"] += c["calls"] if c.get("sync") else 0
        for f, v in c.items():  # figures being added: bandwidth per path, idle per sync
            if ("bandwidth" in f or "idle" in f) and isinstance(v, (int, float)):
                k[f] += v * (c["calls"] if "bandwidth" in f else 1)
    for k in kinds.values():
        for f in [f for f in k if "bandwidth" in f]:
            k[f] /= k["calls"]  # call-weighted mean
    waits = {w["kind"]: {"calls": w["calls"], "wait_ns": w["wait_ns"],
                         **{f: v for f, v in w.items() if "idle" in f}} for w in d["waits"]}
    return {"kinds": kinds, "waits": waits, "summary": d["summary"]}


def fmt(n: float, digits: int = 0) -> str:
    return f"{n:,.{digits}f}"


def cell(count, nbytes, dur) -> str:
    parts = [f"{fmt(count)}"]
    if nbytes is not None:
        parts.append(f"{fmt(nbytes)} B")
    if dur is not None:
        parts.append(f"{fmt(dur, 1 if dur % 1 else 0)} us")
    return " / ".join(parts)


def table(trace: str, raw: dict, hta: dict, md: dict, times: dict) -> str:
    rows = [("figure", "raw gpu_memcpy events", "HTA 0.5", "memcpy-doctor"),
            ("trace: file size / events / float ts / copies with no runtime call",
             f"{fmt(raw['file_bytes'])} B / {fmt(raw['events'])} / {fmt(raw['float_ts'])} / "
             f"{fmt(raw['copies_without_runtime_call'])}", "", "")]
    raw_kinds: dict = defaultdict(lambda: {"count": 0, "bytes": 0, "dur": 0.0, "bw": []})
    for n, r in raw["copies"].items():
        k = raw_kinds[copy_kind(n)]
        for f in ("count", "bytes", "dur", "bw"):
            k[f] += r[f]
    hta_kinds: dict = defaultdict(lambda: {"count": 0, "bytes": 0, "dur": 0.0, "zero_dur": 0})
    for n, r in hta["dataframe_copies"].items():
        for f in ("count", "bytes", "dur", "zero_dur"):
            hta_kinds[copy_kind(n)][f] += r[f]
    hta_sums = defaultdict(lambda: [0, 0.0])
    for n, r in hta["kernel_breakdown"].items():
        if n.startswith("Memcpy"):
            hta_sums[copy_kind(n)][0] += r["count"]
            hta_sums[copy_kind(n)][1] += r["sum"]
    mdk = md["kinds"]
    for kind in sorted(set(raw_kinds) | set(mdk) | set(hta_kinds)):
        r, h, m = raw_kinds.get(kind), hta_sums.get(kind), mdk.get(kind)
        rows.append((f"{kind}: copies / bytes / device time",
                     cell(r["count"], r["bytes"], r["dur"]) if r else "0",
                     cell(h[0], None, h[1]) if h else "0",
                     cell(m["calls"], m["bytes"], m["device_ns"] / 1e3) if m else "0"))

    def tot(kinds: dict, field: str) -> float:
        return sum(v[field] for v in kinds.values())

    rows.append(("all copies / bytes / device time",
                 cell(tot(raw_kinds, "count"), tot(raw_kinds, "bytes"), tot(raw_kinds, "dur")),
                 cell(sum(v[0] for v in hta_sums.values()), None, sum(v[1] for v in hta_sums.values())),
                 cell(tot(mdk, "calls"), tot(mdk, "bytes"), tot(mdk, "device_ns") / 1e3)))
    rows.append(("copies in HTA's DataFrame (its bytes are not reported)", "",
                 cell(tot(hta_kinds, "count"), tot(hta_kinds, "bytes"), tot(hta_kinds, "dur"))
                 + f"; {tot(hta_kinds, 'zero_dur')} of dur <= 0", ""))
    for kind in sorted(raw_kinds):
        r, m = raw_kinds[kind], mdk.get(kind, {})
        hname = f"Memcpy {kind.split()[0]}"
        hb = hta["memory_bw"].get(hname)
        bw_md = [f"{v:,.4g}" for f, v in m.items() if "bandwidth" in f]
        own = f"{m['bytes'] / m['device_ns']:,.4g}" if m.get("device_ns") else "-"
        rows.append((f"{kind}: bandwidth GB/s (raw: bytes/dur, Kineto's mean)",
                     f"{r['bytes'] / r['dur'] / 1e3:,.4g}, {statistics.mean(r['bw']):,.4g}" if r["bw"] else
                     f"{r['bytes'] / r['dur'] / 1e3:,.4g}",
                     f"{hname}{' (pinned and pageable)' if kind.startswith('HtoD') or kind.startswith('DtoH') else ''}"
                     f": mean {hb['mean']:,.4g} over {hb['count']:.0f} points" if hb else "-",
                     ", ".join(bw_md) or f"TODO (bandwidth per copy path; bytes/device_ns = {own})"))
    sync_md = sum(v["sync_calls"] for v in mdk.values())
    rows.append(("copies the host waited for", "-", "-", fmt(sync_md)))
    rt = raw["runtime"]
    rows.append(("sync calls: calls / host time (memcpy-doctor: those not a copy's own)",
                 "; ".join(f"{n} {v['calls']} / {fmt(v['dur'])} us" for n, v in sorted(rt.items())
                           if n in SYNC_CALLS) or "none",
                 "- (not reported)",
                 "; ".join(f"{k} {v['calls']} / {fmt(v['wait_ns'] / 1e3)} us"
                           for k, v in md["waits"].items()) or "none"))
    ls = hta["launch_stats"]
    rows.append(("copy launch calls: calls / host time",
                 "; ".join(f"{n} {v['calls']} / {fmt(v['dur'])} us" for n, v in sorted(rt.items())
                           if n.startswith("cudaMemcpy")) or "none",
                 f"{ls['copy_rows']} / {fmt(ls['copy_cpu_duration'])} us; launch delay "
                 f"{fmt(ls['copy_launch_delay'])} us",
                 f"host time {fmt(tot(mdk, 'host_ns') / 1e3)} us (call + its wait)"))
    cats = ("host_wait", "kernel_wait", "other")
    hid = {c: sum(v.get(c, 0) for v in hta["idle"].values()) for c in cats}
    rid = {c: sum(v[c] for v in raw["rule_idle"].values())
           for c in (*cats, "after_sync", "after_sync_gaps")}
    same = all(abs(raw["rule_idle"].get(s, {}).get(c, 0) - v.get(c, 0)) < 0.01
               for s, v in hta["idle"].items() for c in cats)
    idle_md = [f"{name} {f} {fmt(v / 1e3)} us" for name, k in [*mdk.items(), *md["waits"].items()]
               for f, v in k.items() if "idle" in f]
    rows.append(("GPU idle, all streams: host wait / kernel wait / other (us)",
                 " / ".join(fmt(rid[c]) for c in cats) + f" (HTA's rule recomputed; "
                 f"{'matches' if same else 'DIFFERS'}); host wait after a sync call: "
                 f"{fmt(rid['after_sync_gaps'])} gaps / {fmt(rid['after_sync'])} us",
                 " / ".join(fmt(hid[c]) for c in cats) + f" ({len(hta['idle'])} streams)",
                 ", ".join(idle_md) or "TODO (GPU idle time per sync)"))
    t = hta["temporal"]
    spans = ("idle_time(us)", "compute_time(us)", "non_compute_time(us)", "kernel_time(us)")
    rows.append(("temporal breakdown: idle / compute / non-compute / span (us)",
                 f"X events' span {fmt(raw['span_us'])}; all events' {fmt(raw['all_span_us'])}",
                 " / ".join(fmt(t[k]) for k in spans),
                 f"trace span {fmt(md['summary']['total_ns'] / 1e3)}"))
    cs = hta["cuda_sync_rows_as_gpu_busy"]
    if cs["count"]:
        rows.append(("cuda_sync events counted as GPU busy time", "-",
                     f"{cs['count']} / {fmt(cs['dur'])} us; the breakdown without them: "
                     + " / ".join(fmt(hta["temporal_without_cuda_sync"][k]) for k in spans), "-"))
    c = hta["critical_path"]
    rows.append(("critical path (first ProfilerStep): sync edges / on the path / their time; bound by",
                 "-", c.get("skipped") or c.get("error") or
                 f"{c['sync_edges']} / {c['sync_on_path']} / {fmt(c['sync_weight'])} us; "
                 + ", ".join(f"{k} {v}%" for k, v in c["bound_by_pct"].items() if v), "-"))
    rows.append(("ProfilerSteps: in trace / analysed", ", ".join(raw["profiler_steps"]) or "none",
                 ", ".join(map(str, hta["profiler_steps"])) or "none", "all events"))
    for label, key in (("wall time, s (median)", "wall_s"), ("CPU time (user+sys), s (median)",
                                                             "cpu_s"), ("peak RSS, MiB", "peak_rss_mib")):
        rows.append((label, f"{times['raw'][key]:.2f}", f"{times['hta'][key]:.2f}",
                     f"import {times['md_import'][key]:.2f}; report {times['md_report'][key]:.2f}"))
    ph = hta["phases_s"]
    rows.append(("HTA's phases, s (last run)", "", "; ".join(f"{k} {v:.2f}" for k, v in ph.items()), ""))
    lines = [f"### {trace}", ""] + ["| " + " | ".join(r) + " |" for r in rows[:1]]
    lines += ["|---|---|---|---|"] + ["| " + " | ".join(r) + " |" for r in rows[1:]]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("traces", nargs="*", type=Path, default=DEFAULT_TRACES)
    ap.add_argument("--hta-python", default=os.environ.get("HTA_PYTHON", "/work/htavenv/bin/python"))
    ap.add_argument("--memcpy-doctor", default=shutil.which("memcpy-doctor") or
                    str(ROOT / ".venv" / "bin" / "memcpy-doctor"))
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--include-last-step", action="store_true")
    ap.add_argument("--shift-ts", type=float, default=None)
    ap.add_argument("--drop-copy-launches", action="store_true")
    ap.add_argument("--json", type=Path, help="write every figure here too")
    ap.add_argument("--child", choices=("raw", "hta"), help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        fn = child_raw if a.child == "raw" else child_hta
        Path(a.out).write_text(json.dumps(fn(str(a.traces[0]), a.include_last_step)))
        return

    me, last = str(Path(__file__).resolve()), ["--include-last-step"] if a.include_last_step else []
    everything = {}
    print(f"# python {' '.join(sys.argv)}\n")
    with tempfile.TemporaryDirectory() as tmp:
        for src in a.traces:
            trace = src
            if a.shift_ts is not None or a.drop_copy_launches:
                trace = derive(src, tmp, a.shift_ts, a.drop_copy_launches)
            res, times = {}, {}
            for kind, py in (("raw", sys.executable), ("hta", a.hta_python)):
                out = os.path.join(tmp, f"{kind}.json")
                times[kind] = measure([py, me, "--child", kind, str(trace), "--out", out, *last],
                                      a.repeat)
                res[kind] = json.loads(Path(out).read_text())
            x = os.path.join(tmp, "md.json")
            times["md_import"] = measure([a.memcpy_doctor, "import", str(trace), "-o", x], a.repeat)
            times["md_report"] = measure([a.memcpy_doctor, "report", str(trace)], a.repeat)
            res["md"] = md_figures(x)
            label = src.name + (f" (derived: ts + {a.shift_ts} us as floats)" if a.shift_ts is not None
                                else "") + (" (derived: no copy launch calls)" if a.drop_copy_launches else "")
            print(table(label, res["raw"], res["hta"], res["md"], times))
            print("\nCommands: " + "; ".join(f"{k}: `{v['command'].replace(tmp, '$TMP')}`"
                                          for k, v in times.items()) + "\n")
            everything[src.name] = {**res, "times": times}
    if a.json:
        a.json.write_text(json.dumps(everything, indent=1, default=str))


if __name__ == "__main__":
    main()
