"""Side by side: what HolisticTraceAnalysis (HTA 0.5) and memcpy-doctor report on the same
torch.profiler (Kineto) traces, against the raw `gpu_memcpy` events, with the time and the
memory each takes: docs/kineto.md, "Side by side with HolisticTraceAnalysis (HTA 0.5)".

    python benchmarks/hta_compare.py [TRACE.json.gz ...] [--hta-python PY] [--repeat 3]
        [--include-last-step] [--shift-ts 0.5] [--drop-copy-launches] [--json OUT.json]

Default traces: ../shared/kineto/*.json.gz (HTA's test data). HTA has a venv of its own
(pandas<3: under pandas 3 HTA 0.5's critical_path_analysis raises):

    python3 -m venv /work/htavenv && /work/htavenv/bin/pip install torch==2.13.0 \\
        && /work/htavenv/bin/pip install HolisticTraceAnalysis==0.5.0 "pandas<3"

Each column is a separate process per trace, timed (wall, CPU) with its peak RSS (os.wait4):
  raw   this script: the gpu_memcpy events per name (count, bytes, sum of dur), the sync
        calls, and, recomputed from the events, HTA's idle rule (`rule_idle`) and
        memcpy-doctor's GPU idle per sync (`md_idle`): checks that both are described exactly;
  hta   this script under --hta-python: TraceAnalysis on a folder holding only the trace,
        get_memory_bw_summary, get_gpu_kernel_breakdown(include_memory_kernels=True),
        get_idle_time_breakdown, get_temporal_breakdown, get_cuda_kernel_launch_stats,
        critical_path_analysis (first ProfilerStep), the memcpy rows of its DataFrame;
  md    `memcpy-doctor import TRACE -o X.json` (per copy path: calls, bytes, device time,
        GB/s as the report's Copy path table, idle_ns; idle_ns per wait kind; the total) and
        `memcpy-doctor report TRACE`; plus, once, `explain --format json` (profile GB/s).
Times: the median of --repeat runs; RSS: the largest. Durations in us. --include-last-step:
HTA keeps its last ProfilerStep. --shift-ts F, --drop-copy-launches: all three read a derived
copy of each trace, every ts + F us as a float (ns-resolution traces, which HTA rounds to
whole us), or without the copies' cudaMemcpy* calls and flows (a thread not traced).
"""

from __future__ import annotations

import argparse
import bisect
import gzip
import json
import logging
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
WAIT_KINDS = dict(zip(SYNC_CALLS, ("stream_synchronize", "synchronize", "event_synchronize")))
OK = ("DIFFERS", "matches")
KERNEL_WAIT_US = 30  # HTA's consecutive_kernel_delay default (trace units: us)
corr = lambda e: e.get("args", {}).get("correlation", -1)  # noqa: E731


def load_events(path: str) -> dict:
    with (gzip.open if path.endswith(".gz") else open)(path, "rt") as f:
        return json.load(f)


def copy_kind(name: str) -> str:
    """'Memcpy HtoD (Pinned -> Device)' -> 'HtoD pinned'; DtoD has no host side."""
    direction = name.split()[1] if name.startswith("Memcpy ") else "?"
    return "DtoD" if direction == "DtoD" else f"{direction} {'pinned' if 'Pinned' in name else 'pageable'}"


def stream_of(e: dict) -> int:
    try:
        return int(e.get("args", {}).get("stream", -1))
    except (TypeError, ValueError):
        return -1


def rule_idle(events: list, include_last: bool) -> dict:
    """HTA 0.5's get_idle_time_breakdown, recomputed from the raw events (see docs/kineto.md):
    per stream, the gap before each GPU op (kernel, memcpy, memset; not cuda_sync) is
    ts - previous op's end; host_wait if the op's runtime call started after that end,
    else kernel_wait if the gap < 30 us, else other. HTA first rounds float timestamps
    (ts up, end down) and, with >= 2 ProfilerSteps, drops ops launched in the last one.
    Also: the host-wait gaps in which a sync call (cuda*Synchronize, cudaMemcpy) returned."""
    kept = [e for e in events if e.get("dur") is not None and e.get("cat") not in (None, "Trace")]
    for e in kept:  # common/trace_parser.py: round_down_time_stamps
        e["_ts"], e["_end"] = math.ceil(e["ts"]), math.floor(e["ts"] + e["dur"])
    first = kept[0] if kept and kept[0] is events[0] else None  # HTA's row index 0
    gpu = [e for e in kept if e["cat"] in GPU_CATS and stream_of(e) != -1]
    host = {corr(e): e for e in kept if not (stream_of(e) >= 0 and corr(e) >= 0)}
    steps = [e for e in kept if "ProfilerStep" in e.get("name", "")]
    if len({e["name"] for e in steps}) > 1:  # common/trace.py: _filter_irrelevant_gpu_kernels
        limit = max(e["_end"] if include_last else e["_ts"] for e in steps)  # (<= with the last)
        gpu = [e for e in gpu if corr(e) in host and host[corr(e)]["_ts"] < limit + include_last]
        first = None if first is None or first["_ts"] >= limit else first
    syncs = sorted(e["_end"] for e in kept if e["cat"] == "cuda_runtime"
                   and (e["name"] in SYNC_CALLS or e["name"] == "cudaMemcpy"))
    out: dict = defaultdict(lambda: {"host_wait": 0, "kernel_wait": 0, "other": 0,
                                     "after_sync": 0, "gaps": []})
    by_stream = defaultdict(list)
    for e in gpu:
        by_stream[stream_of(e)].append(e)
    for stream, ops in by_stream.items():
        ops.sort(key=lambda e: e["_ts"])
        out[stream]  # a stream with one op still has a row
        for prev, op in zip(ops, ops[1:]):
            gap = op["_ts"] - prev["_end"]
            launch = host.get(corr(op), first)  # no runtime call: HTA joins row 0
            host_wait = launch is not None and launch["_ts"] > prev["_end"]
            out[stream]["host_wait" if host_wait else "kernel_wait" if gap < KERNEL_WAIT_US
                        else "other"] += gap
            i = bisect.bisect_left(syncs, prev["_end"])  # a sync returned in the gap
            if host_wait and i < len(syncs) and syncs[i] <= launch["_ts"]:
                out[stream]["after_sync"] += gap
                out[stream]["gaps"].append(gap)
    return {str(s): v for s, v in out.items()}


def md_idle(events: list) -> dict:
    """memcpy-doctor's GPU idle per sync (kineto/idle.py), recomputed from the raw events. Sync
    copies: a cudaMemcpy, one from or to pageable memory, or one with a cudaStreamSynchronize
    after it on its thread within its innermost op (`r`: that sync's end, else the call's); other
    cuda*Synchronize calls wait for every stream. end -> next counts if work begun before c (the
    call's start; a copy's launch) still ran at c and next was launched at or after r, once. Also: those left out."""
    ops = sorted((e["ts"], i, e["ts"] + e["dur"], (e.get("pid"), stream_of(e)), e) for i, e
                 in enumerate(events) if e.get("cat") in GPU_CATS and e.get("ph") == "X")
    runtime = {corr(e): e for e in events if e.get("cat") == "cuda_runtime" and e.get("ph") == "X"
               and corr(e) != -1}
    by_stream: dict = defaultdict(list)
    for o in ops:
        by_stream[o[3]].append(o)
    starts = {k: [o[0] for o in v] for k, v in [*by_stream.items(), (None, ops)]}
    host: dict = defaultdict(list)  # per thread: cpu_ops and runtime calls, swept as the reader
    for i, e in enumerate(events):
        if e.get("ph") == "X" and e.get("cat") in ("cpu_op", "cuda_runtime"):
            host[(e.get("pid"), e.get("tid"))].append((e["ts"], -e["dur"], i, e))
    inner, syncs_of = {}, {}  # id(runtime call) -> its innermost op; thread -> stream syncs
    for th, evs in host.items():
        stack: list = []
        for ts, _, i, e in sorted(evs, key=lambda x: x[:3]):
            while stack and stack[-1]["ts"] + stack[-1]["dur"] < ts:
                stack.pop()
            stack += [e] if e["cat"] == "cpu_op" else []
            inner[id(e)] = None if e["cat"] == "cpu_op" or not stack else stack[-1]
        syncs_of[th] = [(i, e) for _, _, i, e in evs if e["name"] == SYNC_CALLS[0]]
    used, claims = set(), []  # claims: (r, the sync's call start, target, stream or None)
    for _, _, _, stream, e in ops:
        path, call = copy_kind(e["name"]) if e["cat"] == "gpu_memcpy" else "?", runtime.get(corr(e))
        if path.split()[0] not in ("HtoD", "DtoH", "DtoD") or call is None:
            continue  # (no call: not a sync copy)
        blocking, op = call["name"] == "cudaMemcpy", inner[id(call)]
        r, sync = call["ts"] + call["dur"], blocking or path.endswith("pageable")
        until = op["ts"] + op["dur"] if op and not blocking else -math.inf
        waits = [(i, w) for i, w in syncs_of[(call.get("pid"), call.get("tid"))]
                 if r <= w["ts"] <= until]
        if waits:
            used.add(id(w := min(waits, key=lambda x: x[0])[1]))  # the first by id
            r, sync = w["ts"] + w["dur"], True
        elif not any(syncs_of.values()) and op and op["name"] == "aten::_local_scalar_dense":
            sync = True
        claims += [(r, call["ts"], path, stream)] if sync else []
    claims += [(e["ts"] + e["dur"], e["ts"], e["name"], None) for e in events if e.get("cat")
               == "cuda_runtime" and e["name"] in SYNC_CALLS and id(e) not in used]
    stretches, left = {}, {}  # next op's index -> (r, ns, target, stream); -> (ns, why)
    for r, c, target, stream in claims:
        ends = [by_stream[k][j][2] for k in ([stream] if stream is not None else by_stream)
                for j in [bisect.bisect_right(starts[k], r) - 1] if j >= 0]  # ties: the later
        lst, j = by_stream.get(stream, ops), bisect.bisect_right(starts[stream], r)
        if not ends or max(ends) > r or j == len(lst):
            continue
        end, nxt = max(ends), lst[j]
        before = max([by_stream[k][i][2] for k in ([stream] if stream is not None else by_stream)
                      for i in [bisect.bisect_left(starts[k], c) - 1] if i >= 0], default=-1)
        launch, ns = runtime.get(corr(nxt[4])), round((nxt[0] - end) * 1000)
        if launch is None or before <= c or launch["ts"] < r:
            left.setdefault(nxt[1], (ns, 0 if before <= c else 1 if launch else 2))
        elif r < stretches.get(nxt[1], (math.inf,))[0]:
            stretches[nxt[1]] = (r, ns, target, stream)
    out: dict = {"targets": defaultdict(int), "stretches": sorted(
        ((ns, t, str(k[1]) if k else "all") for _, ns, t, k in stretches.values()), reverse=True)}
    for ns, target, _ in out["stretches"]:
        out["targets"][target] += ns
    kept = [v for i, v in left.items() if i not in stretches]
    return {**out, "left_out": {why: [len(x := [ns for ns, w in kept if w == i]), sum(x)] for i, why
            in enumerate(("dry when called", "next launched before r", "no launch call"))}}


def child_raw(path: str, include_last: bool) -> dict:
    events = load_events(path)["traceEvents"]
    runtime = {corr(e): e for e in events if e.get("cat") == "cuda_runtime"}
    copies: dict = defaultdict(lambda: {"count": 0, "bytes": 0, "dur": 0.0, "bw": []})
    for e in (e for e in events if e.get("cat") == "gpu_memcpy"):
        r, args = copies[e["name"]], e["args"]
        r["count"], r["bytes"], r["dur"] = r["count"] + 1, r["bytes"] + args.get("bytes", 0), \
            r["dur"] + e["dur"]
        r["bw"] += [args["memory bandwidth (GB/s)"]] if "memory bandwidth (GB/s)" in args else []
    syncs: dict = defaultdict(lambda: {"calls": 0, "dur": 0.0})
    for e in runtime.values():
        if e["name"] in SYNC_CALLS or e["name"].startswith("cudaMemcpy"):
            syncs[e["name"]] = {"calls": syncs[e["name"]]["calls"] + 1,
                                "dur": syncs[e["name"]]["dur"] + e["dur"]}
    timed = [e for e in events if e.get("ph") == "X" and e.get("cat") != "Trace"]
    spanned = [e for e in events if "ts" in e and e.get("cat") != "Trace" and e.get("ph") != "M"]
    span = lambda evs: max(e["ts"] + e.get("dur", 0) for e in evs) - min(e["ts"] for e in evs)  # noqa: E731
    return {"copies": copies, "runtime": syncs, "copies_without_runtime_call": sum(
                corr(e) not in runtime for e in events if e.get("cat") == "gpu_memcpy"),
            "profiler_steps": sorted({e["name"] for e in events
                                      if e.get("name", "").startswith("ProfilerStep")}),
            "float_ts": sum(isinstance(e.get("ts"), float) for e in events),
            "span_us": span(timed), "all_span_us": span(spanned),
            "events": len(events), "file_bytes": os.path.getsize(path),
            "rule_idle": rule_idle(events, include_last), "md_idle": md_idle(events)}


def child_hta(path: str, include_last: bool) -> dict:
    t0 = time.perf_counter()
    import pandas as pd
    from hta.configs.config import logger
    from hta.trace_analysis import TraceAnalysis
    from hta import __version__ as hta_version
    logger.setLevel(logging.ERROR)
    out: dict = {"phases_s": {"import": time.perf_counter() - t0}}

    def timed(name, fn):
        t, result = time.perf_counter(), fn()
        out["phases_s"][name] = time.perf_counter() - t
        return result

    with tempfile.TemporaryDirectory() as tmp:
        shutil.copy(path, os.path.join(tmp, "rank0" + ("".join(Path(path).suffixes[-2:]))))
        ta = timed("load", lambda: TraceAnalysis(trace_dir=tmp, include_last_profiler_step=include_last))
    rank, names = ta.t.get_ranks()[0], ta.t.symbol_table.get_sym_table()
    df = ta.t.get_trace(rank)
    name, cat = (df[c].map(lambda i: names[i]) for c in ("name", "cat"))
    memcpy = df[cat == "gpu_memcpy"]
    out["dataframe_copies"] = {n: {"count": len(r), "bytes": int(r["bytes"].sum()), "dur": float(
        r["dur"].sum()), "zero_dur": int((r["dur"] <= 0).sum())} for n, r in memcpy.groupby(name)}
    out["profiler_steps"] = [int(s) for s in ta.get_profiler_steps()]
    sync_rows = df[(cat == "cuda_sync") & df["stream"].ne(-1)]
    out["cuda_sync_rows_as_gpu_busy"] = {"count": len(sync_rows), "dur": float(sync_rows["dur"].sum())}
    bw = timed("memory_bw_summary", lambda: ta.get_memory_bw_summary(ranks=[rank]))
    out["memory_bw"] = {} if bw is None or bw.empty else {n: {  # empty: no Kineto bandwidth
        k: float(bw.loc[(rank, n), ("memory_bw_gbps", k)]) for k in ("count", "mean")}
        for n in bw.index.get_level_values("name")}
    _, kernels = timed("gpu_kernel_breakdown", lambda: ta.get_gpu_kernel_breakdown(
        visualize=False, include_memory_kernels=True))
    mem = kernels[kernels["kernel_type"] == "MEMORY"]
    out["kernel_breakdown"] = {r["name"]: {"sum": float(r["sum (us)"]), "count": round(
        r["sum (us)"] / r["mean (us)"]) if r["mean (us)"] else 0} for _, r in mem.iterrows()}
    idle, _ = timed("idle_time_breakdown", lambda: ta.get_idle_time_breakdown(
        ranks=[rank], visualize=False, show_idle_interval_stats=True))
    out["idle"] = defaultdict(dict)
    for _, r in idle.iterrows():
        out["idle"][str(int(r["stream"]))][r["idle_category"]] = float(r["idle_time"])
    tb = timed("temporal_breakdown", lambda: ta.get_temporal_breakdown(visualize=False))
    out["temporal"] = {k: float(tb.iloc[0][k]) for k in tb.columns if k != "rank"}
    sync_id = ta.t.symbol_table.get_sym_id_map().get("cuda_sync")
    if sync_id is not None:  # the same breakdown with the cuda_sync rows taken out
        full = ta.t.traces[rank]
        ta.t.traces[rank] = full[full["cat"] != sync_id]  # (put back below)
        tb = ta.get_temporal_breakdown(visualize=False)
        ta.t.traces[rank] = full
        out["temporal_without_cuda_sync"] = {k: float(tb.iloc[0][k]) for k in tb.columns}
    launch = timed("cuda_kernel_launch_stats", lambda: ta.get_cuda_kernel_launch_stats(
        ranks=[rank], visualize=False))[rank]
    on_copy = launch[launch["correlation"].isin(memcpy["correlation"])]
    out["launch_stats"] = {"rows": int(len(launch)), "copy_rows": int(len(on_copy)), **{
        f"copy_{k}": float(on_copy[k].sum()) for k in ("cpu_duration", "gpu_duration", "launch_delay")}}
    return {**out, "critical_path": critical_path(ta, rank, timed),
            "versions": {"pandas": pd.__version__, "hta": hta_version}}


def critical_path(ta, rank: int, timed) -> dict:
    """HTA's only analysis that reads cuda_sync events, on the first ProfilerStep: its sync edges
    (GPU op -> end of the sync call) weigh 0, the time is on the CPU's and GPU's own edges."""
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


def run_child(cmd: list) -> tuple[float, float, float]:
    """Run cmd; return its wall seconds, its CPU seconds and its peak RSS in MiB."""
    with tempfile.TemporaryFile() as err:
        t, p = time.perf_counter(), subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err)
        _, status, usage = os.wait4(p.pid, 0)
        wall, p.returncode = time.perf_counter() - t, os.waitstatus_to_exitcode(status)  # reaped here
        if p.returncode:
            err.seek(0)
            raise SystemExit(f"failed ({p.returncode}): {' '.join(cmd)}\n"
                             + err.read().decode(errors="replace")[-3000:])
    return wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024


def measure(cmd: list, repeat: int) -> dict:
    wall, cpu, rss = zip(*(run_child(cmd) for _ in range(repeat)))
    return {"wall_s": statistics.median(wall), "cpu_s": statistics.median(cpu),
            "peak_rss_mib": max(rss), "command": " ".join(cmd)}


def derive(path: Path, tmp: str, shift: float | None, drop_launches: bool) -> Path:
    d = load_events(str(path))
    ev, out = d["traceEvents"], Path(tmp) / path.name
    if drop_launches:
        corrs = {e["args"].get("correlation") for e in ev if e.get("cat") == "gpu_memcpy"}
        ev = [e for e in ev if not (
            (e.get("cat") == "cuda_runtime" and corr(e) in corrs)
            or (e.get("cat") == "ac2g" and e.get("id") in corrs))]
    for e in ev if shift is not None else []:
        if isinstance(e.get("ts"), (int, float)):
            e["ts"] = float(e["ts"]) + shift
    d["traceEvents"] = ev
    with gzip.open(out, "wt") as f:
        json.dump(d, f)
    return out


def md_figures(path: str, explained: str) -> dict:
    """Per copy path: calls, sync calls, bytes, device, host and idle ns, GB/s = bytes / device
    ns (the report's Copy path table), the profile's GB/s (explain); the waits; the summary."""
    d = json.loads(Path(path).read_text())
    kinds: dict = defaultdict(lambda: defaultdict(int))
    path_of = lambda c: "DtoD" if c["direction"] == "DtoD" else \
        f"{c['direction']} {'pinned' if c.get('pinned') else 'pageable'}"  # noqa: E731
    for c in d["copies"]:
        k = kinds[path_of(c)]
        for f in ("calls", "bytes", "device_ns", "host_ns", "idle_ns"):
            k[f] += c.get(f) or 0
        k["sync_calls"] += c["calls"] if c.get("sync") else 0
    for c in (c for ch in json.loads(explained)["chains"] for c in ch["copies"]):
        if c.get("profile_bandwidth_bps"):
            kinds[path_of(c)]["profile_gbps"] = c["profile_bandwidth_bps"] / 1e9
    return {"kinds": kinds, "waits": {w["kind"]: w for w in d["waits"]}, "summary": d["summary"]}


def fmt(n: float, digits: int = 0) -> str:
    return f"{n:,.{digits}f}"


def cell(count, nbytes, dur) -> str:
    parts = [f"{fmt(count)}"] + ([f"{fmt(nbytes)} B"] if nbytes is not None else [])
    return " / ".join(parts + ([f"{fmt(dur, 1 if dur % 1 else 0)} us"] if dur is not None else []))


def per_path(copies: dict, fields: tuple) -> dict:
    out: dict = defaultdict(lambda: {f: [] if f == "bw" else 0 for f in fields})
    for n, r in copies.items():
        for f in fields:
            out[copy_kind(n)][f] += r[f]
    return out


def table(trace: str, raw: dict, hta: dict, md: dict, times: dict) -> str:
    raw_k = per_path(raw["copies"], ("count", "bytes", "dur", "bw"))
    hta_k = per_path(hta["dataframe_copies"], ("count", "bytes", "dur", "zero_dur"))
    hta_s = per_path({n: r for n, r in hta["kernel_breakdown"].items() if n.startswith("Memcpy")},
                     ("count", "sum"))
    mdk, rt, ri, mi, hi = md["kinds"], raw["runtime"], raw["rule_idle"], raw["md_idle"], hta["idle"]
    tot = lambda kinds, *fs: [sum(v[f] for v in kinds.values()) for f in fs]  # noqa: E731
    rows = [("trace: file size / events / float ts / copies with no runtime call",
             f"{fmt(raw['file_bytes'])} B / {fmt(raw['events'])} / {fmt(raw['float_ts'])} / "
             f"{fmt(raw['copies_without_runtime_call'])}", "", "")]
    for kind in sorted(set(raw_k) | set(mdk) | set(hta_k)):
        r, h, m = raw_k.get(kind), hta_s.get(kind), mdk.get(kind)
        rows.append((f"{kind}: copies / bytes / device time",
                     cell(r["count"], r["bytes"], r["dur"]) if r else "0",
                     cell(h["count"], None, h["sum"]) if h else "0",
                     cell(m["calls"], m["bytes"], m["device_ns"] / 1e3) if m else "0"))
    rows.append(("all copies / bytes / device time", cell(*tot(raw_k, "count", "bytes", "dur")),
                 cell(tot(hta_s, "count")[0], None, tot(hta_s, "sum")[0]),
                 cell(*tot(mdk, "calls", "bytes"), tot(mdk, "device_ns")[0] / 1e3)))
    rows.append(("copies in HTA's DataFrame (its bytes are not reported)", "",
                 cell(*tot(hta_k, "count", "bytes", "dur")) + f"; {tot(hta_k, 'zero_dur')[0]} "
                 "of dur <= 0", ""))
    for kind in sorted(raw_k):
        r, m, hname = raw_k[kind], mdk.get(kind, {}), f"Memcpy {kind.split()[0]}"
        hb, prof = hta["memory_bw"].get(hname), m.get("profile_gbps")
        gbps = m["bytes"] / m["device_ns"] if m.get("device_ns") else None  # as the report's
        rows.append((f"{kind}: GB/s (raw: bytes/dur, Kineto's mean; md: bytes/device time)",
                     f"{r['bytes'] / r['dur'] / 1e3:,.4g}"
                     + (f", {statistics.mean(r['bw']):,.4g}" if r["bw"] else ""),
                     f"{hname}{' (pinned and pageable)' if kind[:4] in ('HtoD', 'DtoH') else ''}"
                     f": mean {hb['mean']:,.4g} over {hb['count']:.0f} points" if hb else "-",
                     "-" if not gbps else f"{gbps:,.4g} (profile {prof:,.4g}, "
                     f"{100 * gbps / prof:{'.2g' if gbps < prof / 10 else '.0f'}}%)" if prof
                     else f"{gbps:,.4g} (no profile)"))
    rows.append(("copies the host waited for", "-", "-", "; ".join(
        f"{k} {v['sync_calls']}" for k, v in sorted(mdk.items()) if v["sync_calls"]) or "none"))
    calls = lambda pick: "; ".join(f"{n} {v['calls']} / {fmt(v['dur'])} us"  # noqa: E731
                                   for n, v in sorted(rt.items()) if pick(n)) or "none"
    rows.append(("sync calls: calls / host time (memcpy-doctor: those not a copy's own)",
                 calls(lambda n: n in SYNC_CALLS), "- (not reported)", "; ".join(
                     f"{k} {v['calls']} / {fmt(v['wait_ns'] / 1e3)} us"
                     for k, v in md["waits"].items()) or "none"))
    ls = hta["launch_stats"]
    rows.append(("copy launch calls: calls / host time", calls(lambda n: n.startswith("cudaMemcpy")),
                 f"{ls['copy_rows']} / {fmt(ls['copy_cpu_duration'])} us; launch delay "
                 f"{fmt(ls['copy_launch_delay'])} us",
                 f"host time {fmt(tot(mdk, 'host_ns')[0] / 1e3)} us (call + its wait)"))
    cats = ("host_wait", "kernel_wait", "other")
    same = all(abs(ri.get(s, {}).get(c, 0) - v.get(c, 0)) < 0.01 for s, v in hi.items() for c in cats)
    rows.append(("GPU idle, HTA's rule, streams summed: host wait / kernel wait / other (us)",
                 " / ".join(map(fmt, tot(ri, *cats))) + f" (recomputed; {OK[same]})",
                 " / ".join(fmt(sum(v.get(c, 0) for v in hi.values())) for c in cats)
                 + f" ({len(hi)} streams; host wait: "
                 + "; ".join(f"{s} {fmt(v.get('host_wait', 0))}" for s, v in hi.items()) + ")",
                 "- (only after syncs, next row)"))
    gaps = sorted((g for v in ri.values() for g in v["gaps"]), reverse=True)
    md_t = {**{k: v["idle_ns"] for k, v in mdk.items() if v["sync_calls"]},
            **{k: v["idle_ns"] or 0 for k, v in md["waits"].items()}}
    rec = {WAIT_KINDS.get(k, k): v for k, v in mi["targets"].items()}
    same = all(md_t.get(k, 0) == rec.get(k, 0) for k in set(md_t) | set(rec))
    rows.append(("GPU idle after a sync (us)",
                 f"HTA's host-wait gaps in which a sync call returned: {len(gaps)} / {fmt(sum(gaps))}"
                 + "".join(f"; stream {s} {fmt(v['after_sync'])}" for s, v in ri.items() if v["gaps"])
                 + ("; largest " + ", ".join(map(fmt, gaps[:4])) if gaps else "")
                 + f". memcpy-doctor's rule recomputed: {len(mi['stretches'])} stretches / "
                 f"{fmt(sum(rec.values()) / 1e3)} ({OK[same]}); largest " + (", ".join(
                     f"{fmt(ns / 1e3)} ({t}, stream {k})" for ns, t, k in mi["stretches"][:4]) or "-")
                 + "; stretches after a sync left out: " + "; ".join(
                     f"{why} {n} / {fmt(ns / 1e3)}" for why, (n, ns) in mi["left_out"].items()),
                 "- (not attributed to syncs)",
                 "; ".join([*(f"{k} {fmt(v / 1e3)}" for k, v in md_t.items()),
                            f"total {fmt(sum(md_t.values()) / 1e3)}"])))
    t, cs, c = hta["temporal"], hta["cuda_sync_rows_as_gpu_busy"], hta["critical_path"]
    spans = ("idle_time(us)", "compute_time(us)", "non_compute_time(us)", "kernel_time(us)")
    rows.append(("temporal breakdown: idle / compute / non-compute / span (us)",
                 f"X events' span {fmt(raw['span_us'])}; all but the Trace window and M events' "
                 f"{fmt(raw['all_span_us'])}", " / ".join(fmt(t[k]) for k in spans),
                 f"total time {fmt(md['summary']['total_ns'] / 1e3)}"))
    rows += [("cuda_sync events counted as GPU busy time", "-", f"{cs['count']} / {fmt(cs['dur'])}"
              " us; the breakdown without them: " + " / ".join(fmt(hta["temporal_without_cuda_sync"][k])
                                                             for k in spans), "-")] if cs["count"] else []
    rows.append(("critical path (first ProfilerStep): sync edges / on the path / their time; "
                 "bound by", "-", c.get("skipped") or c.get("error") or
                 f"{c['sync_edges']} / {c['sync_on_path']} / {fmt(c['sync_weight'])} us; "
                 + ", ".join(f"{k} {v}%" for k, v in c["bound_by_pct"].items() if v), "-"))
    rows.append(("ProfilerSteps: in trace / analysed", ", ".join(raw["profiler_steps"]) or "none",
                 ", ".join(map(str, hta["profiler_steps"])) or "none", "all events"))
    tm = lambda k: "{wall_s:.2f} / {cpu_s:.2f} s, {peak_rss_mib:.1f} MiB".format(**times[k])  # noqa: E731
    rows.append(("wall / CPU (user+sys) time, median; peak RSS", tm("raw"), tm("hta") + " (phases: "
                 + "; ".join(f"{k} {v:.2f}" for k, v in hta["phases_s"].items()) + ")",
                 f"import {tm('md_import')}; report {tm('md_report')}"))
    head = ["| figure | raw gpu_memcpy events | HTA 0.5 | memcpy-doctor |", "|---|---|---|---|"]
    return "\n".join([f"### {trace}", "", *head] + ["| " + " | ".join(r) + " |" for r in rows])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("traces", nargs="*", type=Path, default=DEFAULT_TRACES)
    ap.add_argument("--hta-python", default=os.environ.get("HTA_PYTHON", "/work/htavenv/bin/python"))
    ap.add_argument("--memcpy-doctor", default=shutil.which("memcpy-doctor")
                    or str(ROOT / ".venv/bin/memcpy-doctor"))
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--shift-ts", type=float, default=None)
    for flag in ("--include-last-step", "--drop-copy-launches"):
        ap.add_argument(flag, action="store_true")
    ap.add_argument("--json", type=Path, help="write every figure here too")
    ap.add_argument("--child", choices=("raw", "hta"), help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        fn = child_raw if a.child == "raw" else child_hta
        Path(a.out).write_text(json.dumps(fn(str(a.traces[0]), a.include_last_step)))
        return
    me, last, everything = str(Path(__file__).resolve()), ["--include-last-step"] * a.include_last_step, {}
    derived = a.shift_ts is not None or a.drop_copy_launches
    print(f"# python {' '.join(sys.argv)}\n")
    with tempfile.TemporaryDirectory() as tmp:
        for src in a.traces:
            trace = derive(src, tmp, a.shift_ts, a.drop_copy_launches) if derived else src
            res, times, x = {}, {}, os.path.join(tmp, "md.json")
            for kind, py in (("raw", sys.executable), ("hta", a.hta_python)):
                out = os.path.join(tmp, f"{kind}.json")
                times[kind] = measure([py, me, "--child", kind, str(trace), "--out", out, *last],
                                      a.repeat)
                res[kind] = json.loads(Path(out).read_text())
            times["md_import"] = measure([a.memcpy_doctor, "import", str(trace), "-o", x], a.repeat)
            times["md_report"] = measure([a.memcpy_doctor, "report", str(trace)], a.repeat)
            res["md"] = md_figures(x, subprocess.run(
                [a.memcpy_doctor, "explain", str(trace), "--format", "json"],
                capture_output=True, text=True, check=True).stdout)
            label = src.name + (f" (derived: ts + {a.shift_ts} us as floats)" * (a.shift_ts is not None)
                                + " (derived: no copy launch calls)" * a.drop_copy_launches)
            print(table(label, res["raw"], res["hta"], res["md"], times))
            print("\nCommands: " + "; ".join(f"{k}: `{v['command'].replace(tmp, '$TMP')}`"
                                          for k, v in times.items()) + "\n")
            everything[src.name] = {**res, "times": times}
    if a.json:
        a.json.write_text(json.dumps(everything, indent=1, default=str))


if __name__ == "__main__":
    main()
