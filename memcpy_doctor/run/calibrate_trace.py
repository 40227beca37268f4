"""`calibrate --from-trace`: a device profile fitted to the copies a real GPU made, read from
torch.profiler (Kineto) traces, with no GPU here. The same profile format `calibrate` writes
on a live GPU (run/calibrate.py), with each figure's source and the fit's quality.

    records = trace_timings(paths)          # the copies, latencies and device of the traces
    profile, fits = fit_trace(records, base)  # pure: a profile dict and one Fit per path

The copy fit. Per path, `ns = setup + bytes / bandwidth` over the trace's copies, each one
point (bytes, device ns). The slope (1 / bandwidth) is least squares on absolute time: the
large copies carry nearly all the copy time, so the bandwidth they show is the one that
predicts it. Live calibration weights by relative error instead, because it measures every
size ten times on an idle device; a trace has whatever copies the program made, many of them
a few bytes timed to the microsecond, and a relative fit lets those rounding errors set the
bandwidth (on the shared A100 alexnet trace: 7.7 GB/s, where its copies of 16 MB and more
show 4.3 to 4.4). The setup is the median of `ns - bytes / bandwidth` over the copies, not
the least-squares intercept: the intercept is where the large copies' scatter extrapolates to
zero bytes (-57 us on that trace), the median is what the small copies show (those that spend
at least half their time in setup by the fitted bandwidth; all copies if none do). A path
whose largest copy would spend less time moving bytes than in setup by the fit does not show
its bandwidth: only its setup is fitted, the bandwidth is kept from the base profile, and the
source says so. Exact arithmetic (Fractions), so copies on a line give that line back.

Copies within one device, and between GPUs. The profile's `DtoD` path is a peer copy between
two GPUs (the shipped profiles' NVLink or PCIe figure; the tracer records a copy between
devices as DtoD and one within a device as an op), and only peer copies (`Memcpy PtoP`) fit
it: a copy within one device runs at memory speed, 4 to 21 times a shipped profile's peer
figure, and would make every peer copy that much too fast. A copy within one device (`Memcpy
DtoD (Device -> Device)`, path `DtoD_local`) is fitted the same way, into the figures the
model prices it with, as a kernel that reads and writes each byte: `kernel_min_ns + 2 bytes /
memory_bandwidth`. Its bandwidth, doubled, is the memory bandwidth (live calibration's too
is a device-to-device `copy_`); its setup is kernel_min_ns where the traces have no kernel to
give the shortest; its errors are those of that pricing.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, Iterable

from ..core.costmodel import DeviceProfile
from ..kineto.events import one_line
from ..kineto.reader import is_kineto, read_json
from ..kineto.timing import LOCAL, timings
from ..core.trace import TraceError
from .calibrate import COPY_PATHS, CalibrationError

#: The paths a trace can fit: the four host paths, a peer copy (`PtoP`, the profile's DtoD)
#: and a copy within one device (LOCAL: the memory bandwidth; module docstring).
TRACE_PATHS = (*COPY_PATHS, "DtoD", LOCAL)


@dataclass(frozen=True)
class Fit:
    """One copy path's fit and how well it holds: `time_error` is (modeled - measured) over
    measured, summed over the copies (what a report's memcpy time would be off by);
    `median_error` the median of each copy's |modeled - measured| / measured."""

    path: str
    events: int
    min_bytes: int
    max_bytes: int
    setup_ns: int
    bandwidth: float | None  # bytes/s; None: the copies do not show it
    time_error: float
    median_error: float
    #: LOCAL only: the kernel_min_ns the profile prices these copies' setup with, where the
    #: traces' kernels give it and it is not the fitted setup (the errors are then its).
    priced_setup_ns: int | None = None


def fit_copy_path(points: Iterable[tuple[int, int]],
                  fallback_bandwidth: float) -> tuple[Fraction, Fraction | None]:
    """(setup ns, ns per byte or None) of `ns = setup + bytes * slope` (module docstring):
    least-squares slope, median intercept. None for the slope where the copies do not show
    a bandwidth; the setup is then the median left over after `fallback_bandwidth`."""
    pts = [(Fraction(x), Fraction(y)) for x, y in points]
    if not pts:
        raise CalibrationError("no copies to fit")
    slope: Fraction | None = None
    if len({x for x, _ in pts}) >= 2:
        n = len(pts)
        mx, my = sum(x for x, _ in pts) / n, sum(y for _, y in pts) / n
        sxx = sum((x - mx) ** 2 for x, _ in pts)
        slope = sum((x - mx) * (y - my) for x, y in pts) / sxx
    if slope is not None and slope > 0:
        setup = _setup(pts, slope)
        if slope * max(x for x, _ in pts) >= setup:  # the largest copy shows a bandwidth
            return setup, slope
    return _setup(pts, Fraction(10**9) / Fraction(fallback_bandwidth)), None


def _setup(pts: list[tuple[Fraction, Fraction]], slope: Fraction) -> Fraction:
    """The median of `ns - bytes * slope` over the copies that spend at least half their
    time in setup by it (a copy of megabytes says little about microseconds), or over all
    copies when none does; never below zero."""
    small = [y - slope * x for x, y in pts if 2 * slope * x <= y] or [
        y - slope * x for x, y in pts]
    return max(Fraction(0), _median(small))


def _median(values: list[Fraction]) -> Fraction:
    values = sorted(values)
    mid = len(values) // 2
    return values[mid] if len(values) % 2 else (values[mid - 1] + values[mid]) / 2


def fit_path(path: str, records: list[dict[str, Any]], fallback_bandwidth: float,
             priced_setup_ns: int | None = None) -> Fit:
    """The Fit of one path's `{"bytes", "ns"}` records (see fit_copy_path); its errors are
    those of the fitted setup, or of `priced_setup_ns` where the profile prices the copies'
    setup with another figure (LOCAL's kernel_min_ns)."""
    pts = [(int(r["bytes"]), int(r["ns"])) for r in records]
    setup, slope = fit_copy_path(pts, fallback_bandwidth)
    per_byte = slope if slope is not None else Fraction(10**9) / Fraction(fallback_bandwidth)
    priced = setup if priced_setup_ns is None else Fraction(priced_setup_ns)
    modeled = [priced + per_byte * x for x, _ in pts]
    measured = sum(y for _, y in pts)
    errors = [abs(m - y) / y for m, (_, y) in zip(modeled, pts) if y > 0]
    return Fit(path, len(pts), min(x for x, _ in pts), max(x for x, _ in pts), round(setup),
               None if slope is None else float(Fraction(10**9) / slope),
               float((sum(modeled) - measured) / measured) if measured else 0.0,
               float(_median(errors)) if errors else 0.0, priced_setup_ns)


def trace_timings(paths: list[str]) -> dict[str, Any]:
    """The timings of the torch.profiler traces at `paths`, pooled (kineto/timing.py);
    CalibrationError when one is unreadable, not a torch.profiler trace, from another device
    than the others, or when none holds a copy to fit."""
    pooled: dict[str, Any] = {"device": {}, "sources": list(paths)}
    for path in paths:
        try:
            data = read_json(path)
        except TraceError as e:
            raise CalibrationError(str(e)) from None
        if not is_kineto(data):
            raise CalibrationError(f"{path}: not a torch.profiler trace (--from-trace reads "
                                   "the Chrome-trace JSON torch.profiler writes)")
        try:
            with one_line(path):
                t = timings(data)
        except TraceError as e:
            raise CalibrationError(str(e)) from None
        name, seen = t["device"].get("name"), pooled["device"].get("name")
        if name and seen and name != seen:
            raise CalibrationError(f"{path}: recorded on {name}, the other traces on {seen}: "
                                   "fit one device at a time")
        pooled["device"] = {**t["device"], **pooled["device"]}
        for key, value in t.items():
            if key != "device":
                pooled.setdefault(key, []).extend(value)
    if not any(r["path"] in TRACE_PATHS for r in pooled.get("copies", [])):
        raise CalibrationError(f"{', '.join(paths)}: no copies to fit (gpu_memcpy events "
                               "between host and device, between GPUs or within one)")
    return pooled


def fit_trace(m: dict[str, Any], base: DeviceProfile) -> tuple[dict[str, Any], list[Fit]]:
    """A device profile (the dict DeviceProfile.from_dict reads) fitted to `m` (from
    trace_timings), and the Fit of each copy path it had copies for. What the traces do not
    show is kept from `base`, and each figure's source says which. Copies within one device
    give the memory bandwidth, never the peer DtoD path (module docstring)."""
    dev = m["device"]
    name = dev.get("name") or f"GPU of {m['sources'][0]} (name not recorded)"
    files = ", ".join(m["sources"])
    stamp = f"fitted by memcpy-doctor calibrate --from-trace to {files}"
    traces = f"trace{'s' if len(m['sources']) > 1 else ''}"
    kept = f"not in the {traces}, kept from {base.name}"
    by_path: dict[str, list[dict[str, Any]]] = {}
    for r in m["copies"]:
        by_path.setdefault(r["path"], []).append(r)
    fits = [fit_path(p, by_path[p], base.copy_bandwidth[p]) for p in TRACE_PATHS
            if p in by_path and p != LOCAL]
    bandwidth, setup = dict(base.copy_bandwidth), {}
    for f in fits:
        setup[f.path] = f.setup_ns
        if f.bandwidth is not None:
            bandwidth[f.path] = f.bandwidth
    shown = [f.path for f in fits if f.bandwidth is not None]
    unseen = [p for p in bandwidth if p not in by_path]
    small = [p for p in bandwidth if p in by_path and p not in shown]
    local = by_path.get(LOCAL, [])
    sources = dict(base.sources)
    sources["copy_bandwidth"] = (
        f"{stamp}: least-squares slope of device ns on bytes over each path's gpu_memcpy "
        f"events ({', '.join(shown) or 'none'})"
        + (f"; {kept}: {', '.join(unseen)}" if unseen else "")
        + (f"; kept from {base.name}, its copies too small to show it: {', '.join(small)}"
           if small else "")
        + ("; DtoD is a peer copy between GPUs (Memcpy PtoP): the "
           f"{len(local)} copies within the device (Memcpy DtoD) are priced with "
           "memory_bandwidth instead" if local and "DtoD" not in by_path else ""))
    sources["copy_setup"] = (
        f"{stamp}: median of device ns - bytes / bandwidth per path ({', '.join(setup)})"
        if setup else f"no host<->device or peer copies in the {traces}: every path uses "
                      "copy_setup_ns")
    figures: dict[str, Any] = {}
    if setup:
        figures["copy_setup_ns"] = round(statistics.median(setup.values()))
        sources["copy_setup_ns"] = f"{stamp}: median of the per-path setups"
    kernels = m.get("kernel_ns") or []
    if kernels:
        figures["kernel_min_ns"] = min(kernels)
        sources["kernel_min_ns"] = f"{stamp}: the shortest of {len(kernels)} kernels"
    if local:  # priced as a kernel: kernel_min_ns + 2 bytes / memory_bandwidth
        half = base.memory_bandwidth / 2
        lf = fit_path(LOCAL, local, half)
        if kernels and figures["kernel_min_ns"] != lf.setup_ns:
            lf = fit_path(LOCAL, local, half, figures["kernel_min_ns"])
        fits.append(lf)
        if not kernels:
            figures["kernel_min_ns"] = lf.setup_ns
            sources["kernel_min_ns"] = (
                f"{stamp}: no kernels in the {traces}: the setup of its {len(local)} copies "
                "within the device (Memcpy DtoD), which the model prices as kernels")
        if lf.bandwidth is not None:
            figures["memory_bandwidth"] = 2 * lf.bandwidth
            sources["memory_bandwidth"] = (
                f"{stamp}: twice the least-squares bandwidth of {len(local)} copies within "
                "the device (Memcpy DtoD): each reads and writes every byte, and the model "
                "prices one as a kernel, kernel_min_ns + bytes read and written / "
                "memory_bandwidth")
    sources["copy_fit"] = "; ".join(_quality(f) for f in fits)
    if m.get("sync_ns"):
        figures["sync_ns"] = round(statistics.median(m["sync_ns"]))
        sources["sync_ns"] = (f"{stamp}: median duration of {len(m['sync_ns'])} stream or "
                              "device syncs made while the device was idle")
    calls = m.get("launch_call_ns") or []
    if calls:
        figures["launch_ns"] = round(statistics.median(calls))
        ops, copies = m.get("launch_ns") or [], m.get("memcpy_call_ns") or []
        sources["launch_ns"] = (
            f"{stamp}: median duration of {len(calls)} cudaLaunchKernel calls, which the "
            "profiler slows a little and which leave out the dispatcher"
            + (f"; ops that launched one kernel alone took a median "
               f"{round(statistics.median(ops))} ns of host time over {len(ops)}, the "
               "profiler's own per-op cost included" if ops else "")
            + (f"; a pinned copy's cudaMemcpyAsync call: median "
               f"{round(statistics.median(copies))} ns over {len(copies)}" if copies else ""))
    for key in ("total_memory_bytes", "multi_processor_count", "compute_capability"):
        if key in dev:
            sources[key] = f"{stamp}: deviceProperties"
    for key in ("launch_ns", "kernel_min_ns", "sync_ns", "copy_setup_ns", "memory_bandwidth",
                "peak_flops", "total_memory_bytes", "multi_processor_count",
                "compute_capability"):
        if key not in figures and key not in dev:
            sources[key] = f"{kept}: {base.sources.get(key, 'its figure')}"
    if local and "memory_bandwidth" not in figures:
        sources["memory_bandwidth"] = (
            f"kept from {base.name}, the {len(local)} copies within the device too small to "
            f"show it: {base.sources.get('memory_bandwidth', 'its figure')}")
    sources.pop("note", None)
    profile = {
        "name": name,
        "calibrated": True,
        "total_memory_bytes": int(dev.get("total_memory_bytes", base.total_memory_bytes)),
        "compute_capability": list(dev.get("compute_capability", base.compute_capability)),
        "multi_processor_count": int(dev.get("multi_processor_count",
                                             base.multi_processor_count)),
        "peak_flops": dict(base.peak_flops),
        "memory_bandwidth": figures.get("memory_bandwidth", base.memory_bandwidth),
        "copy_bandwidth": bandwidth,
        "launch_ns": figures.get("launch_ns", base.launch_ns),
        "kernel_min_ns": figures.get("kernel_min_ns", base.kernel_min_ns),
        "copy_setup_ns": figures.get("copy_setup_ns", base.copy_setup_ns),
        "copy_setup": setup,
        "sync_ns": figures.get("sync_ns", base.sync_ns),
        "sources": sources,
    }
    return profile, fits


def _rate(bytes_per_s: float) -> str:
    return (f"{bytes_per_s / 1e12:.3g} TB/s" if bytes_per_s >= 9.995e11
            else f"{bytes_per_s / 1e9:.3g} GB/s")


def _quality(f: Fit) -> str:
    bw = ("bandwidth not shown (copies too small)" if f.bandwidth is None
          else _rate(f.bandwidth) if f.path != LOCAL
          else f"{_rate(f.bandwidth)} (memory_bandwidth {_rate(2 * f.bandwidth)})")
    priced = ("" if f.priced_setup_ns is None
              else f" (priced at kernel_min_ns, {f.priced_setup_ns} ns)")
    return (f"{f.path}: {f.events} events, {f.min_bytes} to {f.max_bytes} B, setup "
            f"{f.setup_ns} ns{priced}, {bw}; total time error {f.time_error:+.1%}, median "
            f"copy error {f.median_error:.1%}")


def fit_lines(fits: list[Fit]) -> list[str]:
    """One line per fitted copy path, for the CLI to show."""
    return [_quality(f) for f in fits]
