"""Call sites: the innermost frame outside torch and memcpy_doctor, found cheaply.

The per-op path finds the user's frame once per op. What it needs is decided once per code
object and cached by the code object's id: hashing a code object rehashes its bytecode and
constants (about 0.5 us for a large function), and `frame.f_lineno` decodes the line table
(about 0.3 us), so a frame is looked up by `(id(code), f_lasti)` instead. The cache keeps each
code object it has seen alive, so an id is never reused while it is cached. Each distinct
(file, line, function) becomes one interned Site, so sites compare and hash by identity in the
aggregates.

Ops inside a torch function written in Python (F.multi_head_attention_forward, say) all have
the site of the one call the function mode saw, unless user code runs between (a hook): a walk
from such an op stops at the function mode's frame for that call (a boundary), whose site is
found once per call, rather than climbing the module stack above it once per op.
"""

from __future__ import annotations

import os
import runpy
import sys
from itertools import islice
from types import CodeType, FrameType
from typing import Any


from ..core.defaults import MAX_STACK_FRAMES
from ..core.paths import PACKAGE_DIR, is_internal_file, is_user_file
from ..core.trace import Site

#: Frames of what runs a script (runpy; memcpy-doctor's runner, which the CLI and click call)
#: are never user code, nor is anything above them: a stack stops there.
_SCRIPT_BOUNDARY = ("<frozen runpy>", runpy.__file__,
                    os.path.join(PACKAGE_DIR, "run", "runner.py"))

_getframe = sys._getframe

#: `SiteResolver.codes` entry of a boundary: the function mode's frame for a call into Python.
BOUNDARY = object()
#: A boundary call's site before an op inside it asked for it.
UNSET = object()


class SiteResolver:
    """Finds and interns user call sites, for one thread.

    `codes` maps id(code) to False for internal code, BOUNDARY for a boundary's code, or a
    dict {f_lasti: Site} for user code; the per-op path reads it directly. The caches are
    shared with the resolvers of the run's other threads (`fork`); the boundary calls now
    running are the thread's own.
    """

    __slots__ = ("codes", "_kept", "_interned", "_stacks", "_ends", "calls", "_user",
                 "_by_caller")

    def __init__(self) -> None:
        self.codes: dict[int, Any] = {}
        self._kept: list[CodeType] = []  # keeps each cached code object's id unique
        self._interned: dict[tuple[str, int, str], Site] = {}
        self._stacks: dict[int, list] = {}  # id(site): [stack, depth, code] (see stack_at)
        self._ends: dict[tuple[int, int], int | None] = {}  # (id(code), f_lasti): end column
        self._user: dict[int, bool] = {}  # id(code): whether it is the user's own code
        #: (id(site), id(the caller's Site)): the stack of a copy made inside a library
        self._by_caller: dict[tuple[int, int], list[Site]] = {}
        #: the boundary calls now running, innermost last: [its frame, its site or UNSET]
        self.calls: list[list] = []

    def fork(self) -> SiteResolver:
        """A resolver for another thread: the same caches, none of this thread's calls."""
        other = SiteResolver.__new__(SiteResolver)
        other.codes, other._kept = self.codes, self._kept
        other._interned, other._stacks, other._ends = self._interned, self._stacks, self._ends
        other._user, other._by_caller = self._user, self._by_caller
        other.calls = []
        return other

    def add_boundary(self, code: CodeType) -> None:
        """Frames of `code` are boundaries: their function keeps [its frame, UNSET] on
        `calls` for as long as it runs."""
        self.codes[id(code)] = BOUNDARY
        self._kept.append(code)

    def classify(self, code: CodeType) -> bool | dict[int, Site]:
        """Cache and return what `codes` holds for `code`."""
        entry: bool | dict[int, Site] = False if is_internal_file(code.co_filename) else {}
        self.codes[id(code)] = entry
        self._kept.append(code)
        return entry

    def site_of(self, frame: FrameType | None) -> Site | None:
        """The interned Site of a user frame."""
        if frame is None:
            return None
        code = frame.f_code
        entry = self.codes.get(id(code))
        if entry is None:
            entry = self.classify(code)
        if entry is False or entry is BOUNDARY:  # an internal frame asked for by name
            return self.new_site(frame, {})
        site = entry.get(frame.f_lasti)
        return site if site is not None else self.new_site(frame, entry)

    def new_site(self, frame: FrameType, entry: dict[int, Site]) -> Site:
        """The Site of a frame position seen for the first time (cached in `entry`)."""
        code = frame.f_code
        name = code.co_filename
        path = name if name.startswith("<") else os.path.abspath(name)
        key = (path, frame.f_lineno, code.co_qualname)
        site = self._interned.get(key)
        if site is None:
            site = self._interned[key] = Site(*key)
        entry[frame.f_lasti] = site
        return site

    def resolve(self) -> Site | None:
        """The current user call site, or None when no user frame is on the stack."""
        return self.resolve_from(_getframe(1))

    def resolve_from(self, frame: FrameType | None) -> Site | None:
        """The user call site at or above `frame`, or None: the innermost user frame's, or
        that of the innermost boundary call if it comes first."""
        codes = self.codes
        while frame is not None:
            entry = codes.get(id(frame.f_code))
            if entry is False:  # torch's or this package's code, the commonest: climb
                frame = frame.f_back
            elif entry is None:
                self.classify(frame.f_code)  # then this frame is looked at again
            elif entry is not BOUNDARY:
                site = entry.get(frame.f_lasti)
                return site if site is not None else self.new_site(frame, entry)
            else:
                for call in reversed(self.calls):  # innermost first: most often the last
                    if call[0] is frame:
                        site = call[1]
                        if site is UNSET:
                            site = call[1] = self.resolve_from(frame.f_back)
                        return site
                # a boundary frame not entered through this resolver: climb past it
                frame = frame.f_back
        return None

    def stack_at(self, site: Site | None) -> tuple[list[Site], int | None]:
        """The user stack of the first copy made at `site` (a copy record keeps the stack of
        its first call, so later calls at the site need no walk; for a site inside a library,
        of the first copy made there from the same line of the user's code, found by a climb
        to it: one list per caller, which the collector files as a path of its own), and
        where, on the line, the call now making a copy ends (two calls on one line are told
        apart by it). The
        user's frame is found by a climb, or, for a copy made through as many frames as the
        last one at the site, where that one's was: the same code, under a frame of torch's
        or this package's own (a look-up rather than a climb of six or more frames)."""
        found = self._stacks.get(id(site))
        if found is None:  # [stack, depth of the frame under the user's last time, its code,
            stack = self.stack()  # and, for a site in a library, the stack's user caller]
            caller = _first_user(stack)
            found = self._stacks[id(site)] = [stack, 0, None,
                                              caller if stack and caller is not stack[0]
                                              else None]
        stack = found[0]
        if found[3] is not None:  # (made in a library: its caller now may be another line)
            caller = self._caller()
            if caller is not found[3] and caller is not None:
                stack = self._by_caller.get((id(site), id(caller)))
                if stack is None:
                    stack = self._by_caller[id(site), id(caller)] = self.stack()
        codes = self.codes
        depth = found[1]
        if depth:  # the copy made through the same frames as last time: no climb
            try:
                below = _getframe(depth)
            except ValueError:  # a shallower stack (autograd's device thread): climb
                below = None
            frame = below.f_back if below is not None else None
            if frame is not None and frame.f_code is found[2]:
                entry = codes.get(id(below.f_code))
                if entry is False or entry is BOUNDARY:
                    end = self._ends.get((id(frame.f_code), frame.f_lasti), UNSET)
                    if end is not UNSET:
                        return stack, end
        frame, depth = _getframe(1), 1  # the innermost frame outside torch and this package:
        while frame is not None:  # a short climb past the tracer's and torch's own frames
            entry = codes.get(id(frame.f_code))
            if entry is None:
                entry = self.classify(frame.f_code)
            if entry is not False and entry is not BOUNDARY:
                found[1], found[2] = depth - 1, frame.f_code
                key = (id(frame.f_code), frame.f_lasti)
                end = self._ends.get(key, UNSET)
                if end is UNSET:
                    end = self._ends[key] = _end_column(frame)
                return stack, end
            frame, depth = frame.f_back, depth + 1
        return stack, None

    def _caller(self) -> Site | None:
        """The site of the innermost frame of the user's own code now running (a copy's
        caller where the copy is made inside a library)."""
        frame = _getframe(2)
        user = self._user
        while frame is not None:
            code = frame.f_code
            mine = user.get(id(code))
            if mine is None:
                mine = user[id(code)] = is_user_file(code.co_filename)
                self._kept.append(code)
            if mine:
                return self.site_of(frame)
            frame = frame.f_back
        return None

    def stack(self, frame: FrameType | None = None) -> list[Site]:
        """Frames outside torch and this package at and above `frame` (default: the caller's),
        innermost first, at most MAX_STACK_FRAMES (used for copies only); when none of those
        is the user's own code (a copy deep in a library), the innermost frame that is
        follows them."""
        frames: list[Site] = []
        if frame is None:
            frame = _getframe(1)
        codes = self.codes
        mine = False  # a frame of the user's own code is kept
        while frame is not None:
            if frame.f_code.co_filename in _SCRIPT_BOUNDARY:
                break  # above lies the launcher (the CLI, click), not the user's program
            entry = codes.get(id(frame.f_code))
            if entry is None:
                entry = self.classify(frame.f_code)
            if entry is not False and entry is not BOUNDARY:
                if len(frames) < MAX_STACK_FRAMES or is_user_file(frame.f_code.co_filename):
                    frames.append(self.site_of(frame))
                    mine = mine or is_user_file(frame.f_code.co_filename)
                if mine and len(frames) >= MAX_STACK_FRAMES:
                    break
            frame = frame.f_back
        return frames


def _first_user(stack: list[Site]) -> Site | None:
    return next((s for s in stack if is_user_file(s.file)), None)


def _end_column(frame: FrameType) -> int | None:
    """Where, on its line, the expression the frame is evaluating (a call) ends: tells two
    calls on one line apart. Python 3.11's code positions, one per 2-byte code unit."""
    try:
        for position in islice(frame.f_code.co_positions(), frame.f_lasti // 2, None):
            return position[3] if position[1] == position[0] else None  # (over several
    except (AttributeError, ValueError):  # lines: no column)
        pass
    return None
