"""Call sites: the innermost frame outside torch and memcpy_doctor, found cheaply.

The per-op path calls `resolve()` once per op. Whether a code object is internal is decided
once per code object and cached, and each distinct (code, line) becomes one interned Site, so
the per-op cost is a short walk over cached dictionary lookups.
"""

from __future__ import annotations

import os
import runpy
import sys
from types import CodeType, FrameType

import torch

from ..defaults import MAX_STACK_FRAMES
from ..trace import Site

_INTERNAL_ROOTS = tuple(
    os.path.dirname(os.path.abspath(m.__file__)) + os.sep
    for m in (torch, sys.modules[__name__.split(".")[0]])
)
#: Frames of the interpreter's own machinery that run a script (runpy) are never user code.
_SCRIPT_BOUNDARY = ("<frozen runpy>", runpy.__file__)
_INTERNAL_FILES = ("<frozen runpy>", "<frozen importlib._bootstrap>",
                   "<frozen importlib._bootstrap_external>")


class SiteResolver:
    """Finds and interns user call sites."""

    __slots__ = ("_internal", "_sites", "_stacks")

    def __init__(self) -> None:
        self._internal: dict[CodeType, bool] = {}
        self._sites: dict[tuple[CodeType, int], Site] = {}
        self._stacks: dict[Site | None, list[Site]] = {}

    def _is_internal(self, code: CodeType) -> bool:
        internal = self._internal.get(code)
        if internal is None:
            name = code.co_filename
            if name.startswith("<"):
                internal = name in _INTERNAL_FILES
            else:
                internal = os.path.abspath(name).startswith(_INTERNAL_ROOTS)
            self._internal[code] = internal
        return internal

    def user_frame(self) -> FrameType | None:
        frame = sys._getframe(1)
        is_internal = self._is_internal
        while frame is not None and is_internal(frame.f_code):
            frame = frame.f_back
        return frame

    def site_of(self, frame: FrameType | None) -> Site | None:
        if frame is None:
            return None
        key = (frame.f_code, frame.f_lineno)
        site = self._sites.get(key)
        if site is None:
            code = frame.f_code
            name = code.co_filename
            path = name if name.startswith("<") else os.path.abspath(name)
            site = Site(path, frame.f_lineno, code.co_qualname)
            self._sites[key] = site
        return site

    def resolve(self) -> Site | None:
        """The current user call site, or None when no user frame is on the stack."""
        return self.site_of(self.user_frame())

    def stack_at(self, site: Site | None) -> list[Site]:
        """The user stack of the first copy made at `site` (a copy record keeps the stack of
        its first call, so later calls at the site need no walk)."""
        found = self._stacks.get(site)
        if found is None:
            found = self._stacks[site] = self.stack()
        return found

    def stack(self) -> list[Site]:
        """User frames, innermost first, at most MAX_STACK_FRAMES (used for copies only)."""
        frames: list[Site] = []
        frame = self.user_frame()
        while frame is not None and len(frames) < MAX_STACK_FRAMES:
            if frame.f_code.co_filename in _SCRIPT_BOUNDARY:
                break  # above runpy lies the launcher (the CLI), not the user's program
            if not self._is_internal(frame.f_code):
                site = self.site_of(frame)
                if site is not None:
                    frames.append(site)
            frame = frame.f_back
        return frames
