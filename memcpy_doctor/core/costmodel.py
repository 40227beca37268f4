"""The cost model of the simulated GPU: device profiles, op and copy times, two-timeline replay.

Op time is a roofline: the larger of FLOPs over peak FLOP/s and bytes moved over memory
bandwidth, plus the shortest kernel's duration. Copy time is a fixed DMA setup plus bytes over
the PCIe bandwidth for that direction and host memory kind; a calibrated profile may give each
path its own setup (`copy_setup`), fitted with its bandwidth from measured copies. The replay
keeps two clocks, the host issuing work and the device running it in order; every synchronous
copy or wait makes the host wait until the device has drained.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

from .defaults import (DEFAULT_DEVICE_PROFILE, HOST_FLOPS, HOST_MEMORY_BANDWIDTH, HOST_OP_NS,
                       PYTHON_OP_NS)


class ProfileError(Exception):
    """A device profile that cannot be found or read."""


@dataclass(frozen=True)
class DeviceProfile:
    name: str
    peak_flops: dict[str, float]
    memory_bandwidth: float
    copy_bandwidth: dict[str, float]
    launch_ns: int
    kernel_min_ns: int
    copy_setup_ns: int
    sync_ns: int
    total_memory_bytes: int
    compute_capability: tuple[int, int] = (8, 0)
    multi_processor_count: int = 108
    calibrated: bool = False
    sources: dict[str, str] = field(default_factory=dict)
    #: Per-path DMA setup in ns ("HtoD_pinned", ...), where measured; other paths use
    #: `copy_setup_ns`. Optional, so profiles written before calibration existed still load.
    copy_setup: dict[str, int] = field(default_factory=dict)
    #: The host side, modeled too (docs/sim-time.md): the program's own Python time per op,
    #: an op's host cost when it launches no kernel, and the host's compute roofline.
    python_op_ns: int = PYTHON_OP_NS
    host_op_ns: int = HOST_OP_NS
    host_flops: float = HOST_FLOPS
    host_memory_bandwidth: float = HOST_MEMORY_BANDWIDTH

    def __post_init__(self) -> None:
        # copy_ns is on the tracer's hot path: look (setup, bandwidth) up by direction and
        # pinnedness in a table built once, with no key formatting per call.
        def entry(path: str) -> tuple[int, float]:
            return self.copy_setup.get(path, self.copy_setup_ns), self.copy_bandwidth[path]

        dtod = entry("DtoD")
        object.__setattr__(self, "_copy_table", {
            "HtoD": (entry("HtoD_pageable"), entry("HtoD_pinned")),
            "DtoH": (entry("DtoH_pageable"), entry("DtoH_pinned")),
            "DtoD": (dtod, dtod),
        })

    @classmethod
    def from_dict(cls, d: Any) -> DeviceProfile:
        if not isinstance(d, dict):
            raise ProfileError("a device profile must be a JSON object")
        try:
            d = {**d, "compute_capability": tuple(d.get("compute_capability", (8, 0)))}
            return cls(**d)
        except (TypeError, ValueError) as e:
            raise ProfileError(f"bad device profile: {e}") from None
        except KeyError as e:
            raise ProfileError(f"bad device profile: copy_bandwidth has no {e}") from None

    def to_dict(self) -> dict[str, Any]:
        from dataclasses import asdict
        d = asdict(self)
        d["compute_capability"] = list(self.compute_capability)
        return d

    def kernel_ns(self, flops: float, nbytes: int, dtype_name: str | None) -> int:
        """Modeled device time of one kernel: a roofline over its FLOPs (at the peak of
        `dtype_name`, needed only with FLOPs) and the bytes it moves."""
        seconds = nbytes / self.memory_bandwidth
        if flops:
            compute = flops / (self.peak_flops.get(dtype_name) or self.peak_flops["other"])
            if compute > seconds:
                seconds = compute
        # (no builtin max() here or in Timeline: on the tracer's per-op path, which calls
        # these for every simulated kernel, it costs more than the rest of the formula)
        return self.kernel_min_ns + round(seconds * 1e9)

    def host_ns(self, flops: float, nbytes: int) -> int:
        """Modeled host time of one op that runs on the host: the dispatcher's cost, plus a
        roofline over the FLOPs and bytes of a kernel computed there."""
        seconds = nbytes / self.host_memory_bandwidth
        if flops:
            compute = flops / self.host_flops
            if compute > seconds:
                seconds = compute
        return self.host_op_ns + round(seconds * 1e9)

    def pin_ns(self, nbytes: int) -> int:
        """Host time to pin a tensor of `nbytes`: a copy into page-locked memory at the host's
        memory bandwidth (`pin_memory()`; the staging a pageable copy spares)."""
        return self.host_op_ns + int(nbytes / self.host_memory_bandwidth * 1e9)

    def copy_ns(self, direction: str, nbytes: int, pinned: bool | None) -> int:
        """Modeled device time of one transfer (DMA setup plus bytes over the link);
        unknown pinnedness (None) counts as pageable."""
        setup, bw = self._copy_table[direction][1 if pinned else 0]
        return setup + round(nbytes / bw * 1e9)


def load_profile(name_or_path: str | None = None) -> DeviceProfile:
    """A shipped profile by name (see `available_profiles`) or a profile JSON file by path."""
    name = name_or_path or DEFAULT_DEVICE_PROFILE
    if os.path.sep in name or name.endswith(".json"):
        try:
            with open(name, encoding="utf-8") as f:
                return DeviceProfile.from_dict(json.load(f))
        except ProfileError as e:
            raise ProfileError(f"{name}: {e}") from None
        except (OSError, ValueError) as e:
            raise ProfileError(f"{name}: cannot read device profile ({e})") from None
    try:
        text = resources.files("memcpy_doctor.core.profiles").joinpath(f"{name}.json").read_text()
    except FileNotFoundError:
        raise ProfileError(
            f"no device profile named {name!r}; shipped: {', '.join(available_profiles())}"
        ) from None
    return DeviceProfile.from_dict(json.loads(text))


def profile_of(trace: Any) -> DeviceProfile:
    """The device profile a trace was modeled with; the default one for a real GPU's trace
    (used only to price changes the trace did not measure)."""
    profile = trace.meta.device_profile
    return DeviceProfile.from_dict(profile) if profile else load_profile()


def available_profiles() -> list[str]:
    root = resources.files("memcpy_doctor.core.profiles")
    return sorted(p.name[:-5] for p in root.iterdir() if p.name.endswith(".json"))


class Timeline:
    """Two clocks in integer ns: the host issuing work and the device queue running it in order.

    Each method advances the clocks for one event and returns the host time the event took
    (its CPU Time in the report). `busy_ns` is the device time of the kernels the per-op path
    queued (a compiled region learns what the ops inside it cost from it).
    """

    __slots__ = ("host_ns", "device_ns", "busy_ns")

    def __init__(self) -> None:
        self.host_ns = 0
        self.device_ns = 0
        self.busy_ns = 0

    def host(self, ns: int) -> int:
        """Host-only work: Python code, an op on the host."""
        self.host_ns += ns
        return ns

    def enqueue(self, launch_ns: int, device_ns: int) -> int:
        """A kernel or an async copy: the host pays the launch; the device runs it when free.
        (The per-op path writes this out for its kernels, tracer/perop.py: a test in
        tests/test_costmodel.py holds the two equal.)"""
        host = self.host_ns = self.host_ns + launch_ns
        start = self.device_ns
        self.device_ns = (host if host > start else start) + device_ns
        return launch_ns

    def staged(self, launch_ns: int, device_ns: int) -> int:
        """A `non_blocking` copy from pageable memory: the driver stages it through its own
        pinned buffers while the host is blocked (`device_ns`, the copy at pageable
        bandwidth), but the host does not wait for earlier device work, and pays no
        `sync_ns`. The tracer records it as sync: the host waited for it (docs/sim-time.md)."""
        start = self.host_ns + launch_ns
        self.device_ns = max(start, self.device_ns) + device_ns
        self.host_ns = start + device_ns
        return launch_ns + device_ns

    def blocking(self, launch_ns: int, device_ns: int, sync_ns: int) -> int:
        """A synchronous copy: queued behind earlier work; the host waits until it is done."""
        before = self.host_ns
        self.host_ns += launch_ns
        end = max(self.host_ns, self.device_ns) + device_ns
        self.device_ns = end
        self.host_ns = end + sync_ns
        return self.host_ns - before

    def drain(self, sync_ns: int) -> int:
        """A host wait with no copy (synchronize): the host waits for the device to drain."""
        before = self.host_ns
        self.host_ns = max(self.host_ns, self.device_ns) + sync_ns
        return self.host_ns - before

    def end_ns(self) -> int:
        return max(self.host_ns, self.device_ns)

    def fork(self) -> ThreadTimeline:
        """The clocks of another host thread: its own host clock, starting now, issuing work
        to this same device queue."""
        return ThreadTimeline(self)


class ThreadTimeline(Timeline):
    """A second host thread's clock over the main timeline's device queue. The run's total is
    the main thread's: its clock already covers, in real time, what other threads did."""

    __slots__ = ("main",)

    def __init__(self, main: Timeline) -> None:
        self.main = main
        self.host_ns = main.host_ns
        self.busy_ns = 0  # the kernels this thread queued

    @property  # type: ignore[override]
    def device_ns(self) -> int:
        return self.main.device_ns

    @device_ns.setter
    def device_ns(self, ns: int) -> None:
        self.main.device_ns = ns
