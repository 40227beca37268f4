"""What encloses each runtime call of a torch.profiler (Kineto) trace: the `cpu_op`s around
it, and the Python frames around it when the profile was recorded with `with_stack=True`;
and, per stream, which kernel ran just before or after a copy.

Kept apart from kineto/reader.py, which maps copies, so that each stays small; both are pure
functions over the events read (kineto/events.py records; parsed dicts are read into them).

Python frames. torch.profiler writes each Python call as a `python_function` event named
`file(line): function`, the file trimmed of the `sys.path` entry it lies under
(`torch/nn/modules/module.py`, `enum.py`, or `train.py` for the script's own folder), and
`line` the function's first line (its `def`), except for frames already running when the
profile started, whose line is where they were then. So a site from such a trace names the
function that made the copy, at its first line, not the line inside it.
"""

from __future__ import annotations

import importlib.util
import os
import re
import sys
from bisect import bisect_left
from collections import defaultdict
from functools import lru_cache
from typing import Any, Iterable

from .events import Event, as_events
from ..core.paths import is_user_file
from ..core.trace import OpRef, Site

#: "train.py(12): step": a Python frame; builtins ("<built-in method item ...>") and module
#: markers ("nn.Module: Linear_0") do not match and are not frames of code.
_FRAME = re.compile(r"^(.+)\((\d+)\): (.+)$")
#: At most this many frames kept in a copy's stack, innermost first (as the tracer keeps).
MAX_FRAMES = 8
#: Trimmed paths of installed libraries are kept under this folder name, so that
#: paths.is_user_file, which looks for it, tells them from the user's own files.
LIBRARY_PREFIX = "site-packages"


class Enclosing:
    """For each runtime call (by `id()` of its event): the cpu_ops enclosing it, outermost
    first, and its Python frames as sites, innermost first (empty without `with_stack`).
    With `op_frames`, also each cpu_op's frames (`op_sites`), for the ops an execution trace
    names as producers (kineto/et.py)."""

    __slots__ = ("ops", "has_python", "_chains", "_op_chains")

    def __init__(self) -> None:
        self.ops: dict[int, list[Event]] = {}
        self.has_python = False
        #: id(runtime call) -> its innermost user-visible frame as a chain (see _op_chains),
        #: made into sites only for the calls asked about (the copies, a few kernels)
        self._chains: dict[int, tuple | None] = {}
        #: id(cpu_op) -> the innermost user-visible frame open at its start, as a chain
        #: (site, chain of the frames around it): one shared tuple per frame, not a list per op
        self._op_chains: dict[int, tuple | None] = {}

    def frames(self, call: Event | None) -> list[Site]:
        """The Python frames (sites) open at the runtime call `call`, innermost first; empty
        when not known (no `with_stack`, or no call)."""
        return _sites(self._chains.get(id(call))) if call is not None else []

    def op_sites(self, op: Event) -> list[Site]:
        """The Python frames (sites) open when the cpu_op `op` started, innermost first; empty
        when not known (no `with_stack`, or `enclosing` was not asked for op frames)."""
        return _sites(self._op_chains.get(id(op)))


def _sites(chain: tuple | None) -> list[Site]:
    """The sites of a chain of frames, innermost first, at most MAX_FRAMES."""
    sites: list[Site] = []
    while chain is not None and len(sites) < MAX_FRAMES:
        sites.append(chain[0])
        chain = chain[1]
    return sites


def enclosing(events: Iterable[Any], op_frames: bool = False) -> Enclosing:
    """One sweep per thread over its cpu_op, python_function and cuda_runtime events, sorted
    by start, longest first, keeping the ops and frames still open at each runtime call (and
    with `op_frames`, at each cpu_op). The keys are the `id()`s of the records of `events`
    (read into records first when they are parsed dicts)."""
    out = Enclosing()
    by_tid: dict[Any, list[Event]] = defaultdict(list)
    for e in as_events(events):
        if e.cat in ("cpu_op", "cuda_runtime", "python_function") and e.ph == "X":
            by_tid[(e.pid, e.tid)].append(e)
    for evs in by_tid.values():
        evs.sort(key=lambda e: (e.ts, -e.dur))
        ops: list[tuple[float, Event]] = []  # (end, event)
        # (end, the frames open there as a chain of sites: (innermost, chain of the rest));
        # a frame that is not a user's (frame_site None) adds nothing to the chain
        frames: list[tuple[float, tuple | None]] = []
        for e in evs:
            ts = e.ts
            while ops and ops[-1][0] < ts:
                ops.pop()
            while frames and frames[-1][0] < ts:
                frames.pop()
            cat, end = e.cat, ts + e.dur
            if cat == "cpu_op":
                ops.append((end, e))
                if op_frames and frames:
                    out._op_chains[id(e)] = frames[-1][1]
            elif cat == "python_function":
                out.has_python = True
                site = frame_site(e.name if e.name is not None else "")
                chain = frames[-1][1] if frames else None
                frames.append((end, (site, chain) if site is not None else chain))
            else:
                key = id(e)
                out.ops[key] = [op for _, op in ops]
                if frames:
                    out._chains[key] = frames[-1][1]
    return out


@lru_cache(maxsize=4096)
def frame_site(name: str) -> Site | None:
    """The Site of a python_function event's name, or None for a frame no edit can go in:
    a builtin, torch's own code, the standard library's, or this package's. An installed
    library's trimmed path is kept under `site-packages/`, so it is not the user's."""
    m = _FRAME.match(name)
    if m is None:
        return None
    path, line, function = m.group(1), int(m.group(2)), m.group(3)
    if path.startswith("<"):
        return None
    if os.path.isabs(path):
        if _internal(path.replace("\\", "/").split("/site-packages/")[-1]):
            return None
        return Site(path, line, function)
    if _internal(path):
        return None
    if _installed(_top(path)):
        path = f"{LIBRARY_PREFIX}/{path}"
    return Site(path, line, function)


def _top(path: str) -> str:
    first = path.replace("\\", "/").split("/")[0]
    return first[:-3] if first.endswith(".py") else first


def _internal(path: str) -> bool:
    return _top(path) in ("torch", "memcpy_doctor") or _top(path) in sys.stdlib_module_names


@lru_cache(maxsize=1024)
def _installed(top: str) -> bool:
    """Whether `top` is a package installed here (under site-packages): a library, not the
    user's code. Looks the name up without importing it."""
    if not top.isidentifier():
        return False
    try:
        spec = importlib.util.find_spec(top)
    except (ImportError, ValueError):
        return False
    origin = (spec.origin or "") if spec is not None else ""
    places = [origin, *(spec.submodule_search_locations or [])] if spec is not None else []
    return any(p and not is_user_file(p) for p in places)


def user_frame(sites: list[Site]) -> Site | None:
    """The innermost of `sites` in the user's own code, else the innermost of all (a copy a
    library made), else None."""
    for s in sites:
        if is_user_file(s.file):
            return s
    return sites[0] if sites else None


class Streams:
    """Each stream's kernels in start order, to find the one that ran just before a copy
    (its producer, inferred) or just after one."""

    def __init__(self, events: Iterable[Event]) -> None:
        by_stream: dict[Any, list[Event]] = defaultdict(list)
        for e in events:
            if e.cat == "kernel":
                by_stream[(e.pid, e.stream)].append(e)
        self._kernels = {s: sorted(ks, key=lambda k: k.ts) for s, ks in by_stream.items()}
        self._starts = {s: [k.ts for k in ks] for s, ks in self._kernels.items()}

    def before(self, copy: Event) -> Event | None:
        """The last kernel on `copy`'s stream that started before it."""
        s = (copy.pid, copy.stream)
        starts = self._starts.get(s)
        if not starts:
            return None
        i = bisect_left(starts, copy.ts)
        return self._kernels[s][i - 1] if i else None

    def after(self, copy: Event) -> Event | None:
        """The first kernel on `copy`'s stream that started after it."""
        s = (copy.pid, copy.stream)
        starts = self._starts.get(s)
        if not starts:
            return None
        i = bisect_left(starts, copy.ts)
        return self._kernels[s][i] if i < len(starts) else None


def inferred_ref(kernel: Event | None, runtime: dict[Any, Event],
                 found: Enclosing) -> OpRef | None:
    """The op that launched `kernel` (its innermost cpu_op, through the correlation id), or
    the kernel's own name when no op is recorded, labelled as inferred: the trace does not
    say which tensors a kernel read or wrote."""
    if kernel is None:
        return None
    call = runtime.get(kernel.corr)
    key = id(call) if call is not None else None
    ops = found.ops.get(key, []) if key is not None else []
    name = (ops[-1].name or "") if ops else (
        kernel.name if kernel.name is not None else "kernel")[:60]
    sites = found.frames(call)
    return OpRef(f"{name} (inferred)", "cuda", user_frame(sites))
