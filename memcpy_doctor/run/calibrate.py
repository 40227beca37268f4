"""Calibrate a device profile on a real GPU: measure the figures the cost model uses, then fit.

    measurements = measure(quick=True)           # needs CUDA: plain records, JSON-ready
    profile = build_profile(measurements, base)  # pure: a dict DeviceProfile.from_dict reads

The two halves are apart on purpose: measuring needs a GPU and gives noisy numbers; fitting is
arithmetic on records, so it is tested exactly on any machine with hand-made records, and a
saved set of measurements can be fitted again later. Nothing here prints; `measure` reports
progress through an optional callback.

What each figure means, and how it is measured:
- copies (per path HtoD/DtoH x pinned/pageable): the wall time of one synchronous copy on an
  idle device, over a range of sizes; fitted as `setup + bytes / bandwidth` (the setup is the
  fitted intercept less the sync latency, since the model adds `sync_ns` to every sync copy);
- launch_ns: the host time of one eager op on the device (dispatcher plus kernel launch);
- kernel_min_ns: the device time of the smallest kernel, queued back to back;
- sync_ns: the host time of `torch.cuda.synchronize()` on an idle device;
- peak_flops: the best achieved matmul FLOP/s per dtype (float32 under the current TF32
  setting; "other" is float32's);
- memory_bandwidth: bytes read plus written per second by a large device-to-device copy.
"""

from __future__ import annotations

import datetime
import statistics
from fractions import Fraction
from time import perf_counter_ns
from typing import Any, Callable, Iterable

from ..core.costmodel import DeviceProfile, available_profiles, load_profile
from ..core.defaults import (CALIBRATE_COPY_SIZES, CALIBRATE_COPY_SIZES_QUICK, CALIBRATE_REPEATS,
                             CALIBRATE_REPEATS_QUICK, DEFAULT_CALIBRATED_PROFILE,
                             DEFAULT_DEVICE_PROFILE)

#: The copy paths measured; DtoD (a peer copy) needs two GPUs and keeps the base figure.
COPY_PATHS = ("HtoD_pinned", "HtoD_pageable", "DtoH_pinned", "DtoH_pageable")
MATMUL_DTYPES = ("float32", "float16", "bfloat16", "float64")
__all__ = ["CalibrationError", "DEFAULT_CALIBRATED_PROFILE", "base_profile_name", "best_bandwidth",
           "best_matmul_flops", "build_profile", "fit_copies", "fit_line", "measure"]

#: How each figure is measured, as cited in the profile's sources.
METHODS = {
    "copy_bandwidth": "weighted least-squares fit of setup + bytes/bandwidth to the median "
                      "wall time of synchronous copies ({sizes}) per path; DtoD not measured",
    "copy_setup": "fitted intercept per path less sync_ns (the model adds sync_ns itself)",
    "copy_setup_ns": "median of the per-path setups",
    "launch_ns": "median host time per op of back-to-back x.add_(1) on a 1-element tensor",
    "kernel_min_ns": "CUDA-event time per kernel of back-to-back x.add_(1) queued behind "
                     "torch.cuda._sleep",
    "sync_ns": "median wall time of torch.cuda.synchronize() on an idle device",
    "peak_flops": "best achieved FLOP/s (2n^3 per n x n matmul, CUDA events) per dtype; "
                  "float32 with allow_tf32={tf32}; other = float32",
    "memory_bandwidth": "best bytes read plus written per second of a device-to-device "
                        "copy_ (CUDA events)",
}


class CalibrationError(Exception):
    """Measurements that cannot be fitted (too few sizes, times that do not grow with size),
    or calibration asked for where there is no CUDA GPU."""


# ----- fitting: pure -----

def fit_line(points: Iterable[tuple[int, int]]) -> tuple[Fraction, Fraction]:
    """(intercept, slope) of `y = a + b x` by least squares weighted by 1/y^2.

    Weighted by relative error because copy times span five orders of magnitude: unweighted,
    the noise of the largest copies would swamp the setup that the small ones measure. Exact
    (Fractions) so that points on a line give that line back exactly.
    """
    pts = [(Fraction(x), Fraction(y)) for x, y in points]
    if len({x for x, _ in pts}) < 2:
        raise CalibrationError("a fit needs measurements at two or more sizes")
    if any(y <= 0 for _, y in pts):
        raise CalibrationError("a fit needs positive times")
    w = [1 / (y * y) for _, y in pts]
    sw = sum(w)
    sx = sum(wi * x for wi, (x, _) in zip(w, pts))
    sy = sum(wi * y for wi, (_, y) in zip(w, pts))
    sxx = sum(wi * x * x for wi, (x, _) in zip(w, pts))
    sxy = sum(wi * x * y for wi, (x, y) in zip(w, pts))
    slope = (sw * sxy - sx * sy) / (sw * sxx - sx * sx)
    return (sy - slope * sx) / sw, slope


def _median_by_size(records: list[dict[str, Any]]) -> list[tuple[int, int]]:
    by_size: dict[int, list[int]] = {}
    for r in records:
        by_size.setdefault(int(r["bytes"]), []).append(int(r["ns"]))
    return sorted((size, _median(times)) for size, times in by_size.items())


def _median(values: Iterable[float]) -> int:
    values = list(values)
    if not values:
        raise CalibrationError("no samples")
    return round(statistics.median(values))


def fit_copies(records: list[dict[str, Any]], sync_ns: int) -> dict[str, tuple[int, float]]:
    """Per copy path, (setup_ns, bandwidth in bytes/s) from `{"path", "bytes", "ns"}` records
    (several per size allowed: their median is fitted). The setup is the intercept less
    `sync_ns`, never below zero."""
    paths: dict[str, list[dict[str, Any]]] = {}
    for r in records:
        paths.setdefault(r["path"], []).append(r)
    fitted = {}
    for path, recs in sorted(paths.items()):
        try:
            intercept, slope = fit_line(_median_by_size(recs))
        except CalibrationError as e:
            raise CalibrationError(f"copies {path}: {e}") from None
        if slope <= 0:
            raise CalibrationError(f"copies {path}: the measured times do not grow with size")
        fitted[path] = (max(0, round(intercept - sync_ns)), float(Fraction(10**9) / slope))
    return fitted


def best_matmul_flops(records: list[dict[str, Any]]) -> dict[str, float]:
    """Per dtype, the best achieved FLOP/s over `{"dtype", "n", "ns"}` records (one n x n
    matmul each, 2 n^3 FLOPs)."""
    best: dict[str, float] = {}
    for r in records:
        flops = float(Fraction(2 * int(r["n"]) ** 3 * 10**9, int(r["ns"])))
        best[r["dtype"]] = max(best.get(r["dtype"], 0.0), flops)
    return best


def best_bandwidth(records: list[dict[str, Any]]) -> float:
    """The best bytes per second over `{"bytes", "ns"}` records."""
    if not records:
        raise CalibrationError("memory: no samples")
    return max(float(Fraction(int(r["bytes"]) * 10**9, int(r["ns"]))) for r in records)


def base_profile_name(device_name: str) -> str:
    """The shipped profile of the same device, if there is one, else the default: the
    figures calibration cannot measure (peer copies) are taken from it."""
    for name in available_profiles():
        if load_profile(name).name == device_name:
            return name
    return DEFAULT_DEVICE_PROFILE


def build_profile(m: dict[str, Any], base: DeviceProfile) -> dict[str, Any]:
    """A calibrated device profile (the dict `DeviceProfile.from_dict` reads) from the
    records `measure` returns; what was not measured is kept from `base`, and says so."""
    dev = m["device"]
    stamp = f"measured by memcpy-doctor calibrate on {dev['name']}, torch {m['torch_version']}, " \
            f"{m['date']}"

    def cite(figure: str, **fmt: Any) -> str:
        return f"{stamp}: {METHODS[figure].format(**fmt)}"

    sync_ns = _median(m["sync_ns"])
    copies = fit_copies(m["copies"], sync_ns)
    copy_bandwidth = dict(base.copy_bandwidth)
    copy_setup = {}
    for path, (setup, bw) in copies.items():
        copy_bandwidth[path] = bw
        copy_setup[path] = setup
    sizes = sorted({int(r["bytes"]) for r in m["copies"]})
    flops = best_matmul_flops(m.get("matmul", []))
    peak = dict(base.peak_flops)
    peak.update(flops)
    if "float32" in flops:
        peak["other"] = flops["float32"]
    unmeasured = [k for k in peak if k not in flops and not (k == "other" and "float32" in flops)]
    sources = {
        "copy_bandwidth": cite("copy_bandwidth", sizes=f"{sizes[0]} to {sizes[-1]} bytes")
        + (f"; kept from {base.name}: {', '.join(sorted(set(copy_bandwidth) - set(copies)))}"
           if set(copy_bandwidth) - set(copies) else ""),
        "copy_setup": cite("copy_setup"),
        "copy_setup_ns": cite("copy_setup_ns"),
        "launch_ns": cite("launch_ns"),
        "kernel_min_ns": cite("kernel_min_ns"),
        "sync_ns": cite("sync_ns"),
        "peak_flops": cite("peak_flops", tf32=m.get("allow_tf32", False))
        + (f"; not measured, kept from {base.name}: {', '.join(unmeasured)}"
           if unmeasured else ""),
        "memory_bandwidth": cite("memory_bandwidth"),
        "total_memory_bytes": f"{stamp}: torch.cuda.get_device_properties().total_memory",
        "compute_capability": f"{stamp}: torch.cuda.get_device_properties() major.minor",
        "multi_processor_count": f"{stamp}: "
                                 "torch.cuda.get_device_properties().multi_processor_count",
    }
    return {
        "name": dev["name"],
        "calibrated": True,
        "total_memory_bytes": int(dev["total_memory_bytes"]),
        "compute_capability": list(dev["compute_capability"]),
        "multi_processor_count": int(dev["multi_processor_count"]),
        "peak_flops": peak,
        "memory_bandwidth": best_bandwidth(m["memory"]),
        "copy_bandwidth": copy_bandwidth,
        "launch_ns": _median(m["launch_ns"]),
        "kernel_min_ns": _median(m["kernel_min_ns"]),
        "copy_setup_ns": _median(copy_setup.values()) if copy_setup else base.copy_setup_ns,
        "copy_setup": copy_setup,
        "sync_ns": sync_ns,
        "sources": sources,
    }


# ----- measuring: needs CUDA -----

def measure(quick: bool = False,
            progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Measure this machine's GPU (device 0). Returns the records `build_profile` fits.

    Runs untraced and takes a few seconds (`quick`) to a minute. Raises CalibrationError when
    torch sees no CUDA device.
    """
    import torch
    if not torch.cuda.is_available():
        raise CalibrationError("calibrate needs a CUDA GPU (torch sees none here)")
    note = progress or (lambda _msg: None)
    props = torch.cuda.get_device_properties(0)
    torch.cuda.set_device(0)
    repeats = CALIBRATE_REPEATS_QUICK if quick else CALIBRATE_REPEATS
    sizes = CALIBRATE_COPY_SIZES_QUICK if quick else CALIBRATE_COPY_SIZES
    m: dict[str, Any] = {
        "device": {"name": props.name, "total_memory_bytes": props.total_memory,
                   "compute_capability": [props.major, props.minor],
                   "multi_processor_count": props.multi_processor_count},
        "torch_version": torch.__version__,
        "date": datetime.date.today().isoformat(),
        "allow_tf32": bool(torch.backends.cuda.matmul.allow_tf32),
    }
    note("sync latency")
    m["sync_ns"] = _sync_samples(torch, repeats * 5)
    note("launch latency and smallest kernel")
    m["launch_ns"], m["kernel_min_ns"] = _launch_samples(torch, repeats)
    note(f"copies: {len(COPY_PATHS)} paths x {len(sizes)} sizes")
    m["copies"] = _copy_records(torch, sizes, repeats)
    note("matmul FLOP/s per dtype")
    m["matmul"] = _matmul_records(torch, quick)
    note("memory bandwidth")
    m["memory"] = _memory_records(torch, quick)
    return m


def _sync_samples(torch: Any, n: int) -> list[int]:
    torch.cuda.synchronize()
    samples = []
    for _ in range(n):
        t0 = perf_counter_ns()
        torch.cuda.synchronize()
        samples.append(perf_counter_ns() - t0)
    return samples


def _launch_samples(torch: Any, repeats: int, ops: int = 200) -> tuple[list[int], list[int]]:
    x = torch.zeros(1, device="cuda")
    x.add_(1)
    torch.cuda.synchronize()
    launch, kernel = [], []
    for _ in range(repeats):
        t0 = perf_counter_ns()
        for _ in range(ops):
            x.add_(1)
        launch.append((perf_counter_ns() - t0) // ops)
        torch.cuda.synchronize()
        # Hold the stream with a spin kernel so that every add is queued before the first
        # runs: the events then time kernels back to back, not the host's launch rate.
        torch.cuda._sleep(50_000_000)
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(ops):
            x.add_(1)
        stop.record()
        stop.synchronize()
        kernel.append(round(start.elapsed_time(stop) * 1e6 / ops))
    return launch, kernel


def _copy_records(torch: Any, sizes: tuple[int, ...], repeats: int) -> list[dict[str, Any]]:
    records = []
    for size in sizes:
        n = size // 4
        device = torch.empty(n, device="cuda")
        hosts = {"pinned": torch.empty(n, pin_memory=True), "pageable": torch.empty(n)}
        for path in COPY_PATHS:
            direction, kind = path.split("_")
            host = hosts[kind]
            dst, src = (device, host) if direction == "HtoD" else (host, device)
            dst.copy_(src)  # warm-up
            for _ in range(repeats):
                torch.cuda.synchronize()
                t0 = perf_counter_ns()
                dst.copy_(src)  # synchronous: the host waits for it
                records.append({"path": path, "bytes": n * 4, "ns": perf_counter_ns() - t0})
        del device, hosts
    return records


def _timed(torch: Any, fn: Callable[[], Any], reps: int) -> int:
    """Device ns per call of `fn`, by CUDA events around `reps` calls after a warm-up."""
    fn()
    torch.cuda.synchronize()
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        fn()
    stop.record()
    stop.synchronize()
    return round(start.elapsed_time(stop) * 1e6 / reps)


def _matmul_records(torch: Any, quick: bool) -> list[dict[str, Any]]:
    records = []
    for name in MATMUL_DTYPES:
        dtype = getattr(torch, name)
        n = (1024 if quick else 2048) if name == "float64" else (2048 if quick else 8192)
        try:
            a = torch.randn(n, n, device="cuda", dtype=dtype)
            b = torch.randn(n, n, device="cuda", dtype=dtype)
            ns = _timed(torch, lambda a=a, b=b: torch.mm(a, b), 3 if quick else 10)
        except RuntimeError:  # a dtype this GPU cannot multiply: keep the base figure
            continue
        records.append({"dtype": name, "n": n, "ns": ns})
        del a, b
    return records


def _memory_records(torch: Any, quick: bool) -> list[dict[str, Any]]:
    nbytes = (64 if quick else 512) << 20
    src = torch.empty(nbytes // 4, device="cuda")
    dst = torch.empty_like(src)
    return [{"bytes": 2 * nbytes, "ns": _timed(torch, lambda: dst.copy_(src), 5)}
            for _ in range(3)]
