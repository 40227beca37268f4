"""The bandwidth each copy path reached, beside what the device can do on that path.

The first question about a slow copy is "pinned or pageable, and at what GB/s against the
device's peak". A path is a direction and, for a copy between host and device, whether the
host side is pinned. Its rate is its bytes over its copies' device time (the DMA engine's
busy time, as torch.profiler's `gpu_memcpy` events and the simulated GPU give it): many small
copies show a low rate because each pays its setup, which is the point.

The reference beside it is the device profile's figure for that path: the modeled profile
of a simulated trace, else the shipped profile of the trace's GPU (core/profiles), found by
its name, or by its model (an "A100-PG509-200" takes the A100's) where no name matches. Those
figures are what a copy of that kind reaches on such a machine, not a datasheet's link rate.
A copy between devices has none: a trace's `DtoD` may be a copy within one device (device
memory bandwidth) or between two (NVLink or PCIe), and the trace does not say which.
"""

from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass
from importlib import resources

from ..core.costmodel import DeviceProfile, available_profiles, load_profile
from ..core.trace import CopyRecord, Trace

#: Model names that tell a shipped profile's GPU, as they appear in device names.
_MODEL = re.compile(r"\b(A100|H100|H200|L4|RTX 4090|4090)\b", re.IGNORECASE)


@dataclass(frozen=True)
class PathRate:
    """One copy path's figures over the trace: `reference_bps`, the profile's bytes per
    second for it (None: no profile, or a copy between devices)."""

    direction: str
    pinned: bool | None
    calls: int
    sync_calls: int
    bytes: int
    device_ns: int
    reference_bps: float | None

    @property
    def bps(self) -> float | None:
        """Bytes per second over its device time; None where the copies were not timed."""
        return self.bytes / self.device_ns * 1e9 if self.device_ns else None

    @property
    def name(self) -> str:
        kind = {True: " pinned", False: " pageable", None: ""}[self.pinned]
        return f"{self.direction}{kind}"


@dataclass(frozen=True)
class Reference:
    """The profile the paths are set beside: its name, and whether it is the one the trace
    was modeled with (a simulated trace) or the shipped one for the trace's GPU."""

    name: str
    profile: DeviceProfile
    modeled: bool


def reference(trace: Trace) -> Reference | None:
    """The device profile for `trace`'s paths (see the module docstring); None when no
    shipped profile is of its GPU."""
    if trace.meta.device_profile:
        profile = DeviceProfile.from_dict(trace.meta.device_profile)
        return Reference(profile.name, profile, True)
    name = shipped_profile_for(trace.meta.device_name)
    return None if name is None else Reference(name, load_profile(name), False)


def shipped_profile_for(device_name: str) -> str | None:
    """The shipped profile of a GPU named `device_name`: the one of that name, else of that
    model; None for another GPU."""
    shipped = _shipped_names()
    exact = [n for n, full in shipped.items() if full == device_name]
    if exact:
        return exact[0]
    model = _MODEL.search(device_name)
    if model is None:
        return None
    want = model.group(1).upper().replace("RTX ", "")
    found = [n for n, full in shipped.items()
             if (m := _MODEL.search(full)) and m.group(1).upper().replace("RTX ", "") == want]
    return found[0] if found else None


@functools.cache
def _shipped_names() -> dict[str, str]:
    """Each shipped profile's file name -> the GPU name it is of."""
    root = resources.files("memcpy_doctor.core.profiles")
    return {n: json.loads(root.joinpath(f"{n}.json").read_text()).get("name", "")
            for n in available_profiles()}


def path_rates(trace: Trace, ref: Reference | None = None) -> list[PathRate]:
    """Each copy path of `trace` (host->device first, pageable before pinned), with the
    reference figure from `ref` (see `reference`)."""
    sums: dict[tuple[str, bool | None], list[int]] = {}
    for c in trace.copies:
        entry = sums.setdefault((c.direction, c.pinned), [0, 0, 0, 0])
        entry[0] += c.calls
        entry[1] += c.calls if c.sync else 0
        entry[2] += c.bytes
        entry[3] += c.device_ns
    order = {"HtoD": 0, "DtoH": 1, "DtoD": 2}
    return [PathRate(d, p, calls, sync, nbytes, ns, _reference_bps(ref, d, p))
            for (d, p), (calls, sync, nbytes, ns) in sorted(
                sums.items(), key=lambda kv: (order.get(kv[0][0], 3), kv[0][1] is True))]


def share_text(ratio: float) -> str:
    """A share as a percentage: whole from 10% up, two significant digits below."""
    return f"{ratio:.0%}" if ratio >= 0.1 else f"{ratio * 100:.2g}%"


def copy_rate(copy: CopyRecord) -> float | None:
    """One copy record's bytes per second over its device time (None: untimed)."""
    return copy.bytes / copy.device_ns * 1e9 if copy.device_ns else None


def rate_words(copy: CopyRecord, ref: Reference | None) -> str:
    """A copy path's rate as explain says it: "pageable, 4.4 GB/s of the profile's 12
    (37%)"; "" where its copies were not timed."""
    bps = copy_rate(copy)
    if bps is None:
        return ""
    kind = {True: "pinned, ", False: "pageable, ", None: ""}[copy.pinned]
    peak = reference_bps(ref, copy)
    of = f" of the profile's {peak / 1e9:.3g} ({share_text(bps / peak)})" if peak else ""
    return f"{kind}{bps / 1e9:.3g} GB/s{of}"


def reference_bps(ref: Reference | None, copy: CopyRecord) -> float | None:
    """The profile's bytes per second for a copy record's path (None: see `reference`)."""
    return _reference_bps(ref, copy.direction, copy.pinned)


def _reference_bps(ref: Reference | None, direction: str, pinned: bool | None) -> float | None:
    if ref is None or direction not in ("HtoD", "DtoH") or pinned is None:
        return None
    return ref.profile.copy_bandwidth.get(f"{direction}_{'pinned' if pinned else 'pageable'}")
