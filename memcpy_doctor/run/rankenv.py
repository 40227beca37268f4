"""Which rank of a distributed run this process is, and where each rank's trace goes.

torchrun (and `memcpy-doctor profile --ranks N`) start one process per rank with RANK,
LOCAL_RANK and WORLD_SIZE in the environment. When WORLD_SIZE is above 1, every rank writes
its own trace, named by its global RANK: `-o trace.json` becomes `trace.rank0.json`,
`trace.rank1.json`, ... (the rank goes before the last extension, or at the end when there is
none). A run of one process (no WORLD_SIZE, or WORLD_SIZE=1) keeps the name as given.

`explain`, `check` and `diff` take the rank traces back with `expand_traces`: a glob, a
folder (what torch.profiler's `tensorboard_trace_handler` writes: one file per rank), or the
name `profile` was given (`trace.json` stands for its `trace.rank*.json` when it does not
exist itself).
"""

from __future__ import annotations

import glob
import os
import re
from dataclasses import dataclass
from typing import Mapping

#: The name part that marks a rank's trace: `trace.rank3.json`.
RANK_TAG = ".rank"
#: The files of a folder that are read as traces (torch.profiler's `.pt.trace.json`, ours).
TRACE_SUFFIXES = (".json", ".json.gz")


class RankError(ValueError):
    """RANK / WORLD_SIZE that do not describe a rank, or a trace pattern that matches nothing."""


@dataclass(frozen=True)
class RankInfo:
    rank: int
    world_size: int
    local_rank: int


def rank_info(environ: Mapping[str, str] | None = None) -> RankInfo | None:
    """This process's rank, from the variables torchrun sets; None outside a launcher (no
    RANK or no WORLD_SIZE). RankError when they are set but not sensible numbers."""
    env = os.environ if environ is None else environ
    if "RANK" not in env or "WORLD_SIZE" not in env:
        return None
    try:
        rank, world = int(env["RANK"]), int(env["WORLD_SIZE"])
        local = int(env.get("LOCAL_RANK", rank))
    except ValueError:
        raise RankError(f"RANK={env['RANK']!r}, WORLD_SIZE={env['WORLD_SIZE']!r}: not "
                           "whole numbers") from None
    if world < 1 or not 0 <= rank < world:
        raise RankError(f"RANK={rank}, WORLD_SIZE={world}: RANK must be in "
                           f"0..WORLD_SIZE-1")
    return RankInfo(rank, world, local)


def rank_path(path: str, rank: int) -> str:
    """`trace.json` -> `trace.rank3.json`; `out` -> `out.rank3`."""
    head, tail = os.path.split(path)
    stem, ext = os.path.splitext(tail)
    return os.path.join(head, f"{stem}{RANK_TAG}{rank}{ext}")


def path_for(path: str, info: RankInfo | None) -> str:
    """Where this process writes `path`: named by rank when it is one of several ranks."""
    if info is None or info.world_size <= 1:
        return path
    return rank_path(path, info.rank)


def rank_siblings(path: str) -> list[str]:
    """The rank traces `profile -o path` wrote in a run of several ranks, in rank order."""
    head, tail = os.path.split(path)
    stem, ext = os.path.splitext(tail)
    pattern = re.compile(re.escape(stem + RANK_TAG) + r"(\d+)" + re.escape(ext) + r"\Z")
    found = []
    for name in os.listdir(head or "."):
        m = pattern.match(name)
        if m:
            found.append((int(m.group(1)), os.path.join(head, name)))
    return [p for _, p in sorted(found)]


def _natural(path: str) -> list:
    """Sort key that puts rank10 after rank2."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", path)]


def expand_traces(args: list[str]) -> list[str]:
    """The trace files `args` name, in order: a file that exists is itself; a folder is the
    `.json` and `.json.gz` files in it, a glob pattern its matching files (both in natural
    order); a missing file that has rank traces beside it is those. Anything else is kept,
    so that loading it names the problem. RankError (a usage error) when a pattern or a
    folder holds no trace file."""
    out: list[str] = []
    for arg in args:
        if os.path.isdir(arg):
            found = sorted((os.path.join(arg, n) for n in os.listdir(arg)
                            if n.endswith(TRACE_SUFFIXES)
                            and os.path.isfile(os.path.join(arg, n))), key=_natural)
            if not found:
                raise RankError(f"{arg}: a folder with no trace file in it (.json, .json.gz)")
            out.extend(found)
        elif os.path.exists(arg):
            out.append(arg)
        elif glob.has_magic(arg):
            matches = sorted((m for m in glob.glob(arg) if os.path.isfile(m)), key=_natural)
            if not matches:
                raise RankError(f"{arg}: no trace file matches")
            out.extend(matches)
        else:
            try:
                siblings = rank_siblings(arg)
            except OSError:
                siblings = []
            out.extend(siblings or [arg])
    return out
