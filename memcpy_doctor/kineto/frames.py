"""Python frames of a torch.profiler (Kineto) trace as sites: which `python_function` events
name code a user can edit, and where.

torch.profiler writes each Python call as a `python_function` event named
`file(line): function`, the file trimmed of the `sys.path` entry it lies under
(`torch/nn/modules/module.py`, `enum.py`, or `train.py` for the script's own folder), and
`line` the function's first line (its `def`), except for frames already running when the
profile started, whose line is where they were then. So a site from such a trace names the
function that made the copy, at its first line, not the line inside it.

A frame no edit can go in (a builtin, torch's own code, the standard library's, this
package's) is not a site; kineto/events.py keeps no row for it, as it adds nothing to the
frames around a call.
"""

from __future__ import annotations

import importlib.util
import os
import re
import sys
from functools import lru_cache

from ..core.paths import is_user_file
from ..core.trace import Site

#: "train.py(12): step": a Python frame; builtins ("<built-in method item ...>") and module
#: markers ("nn.Module: Linear_0") do not match and are not frames of code.
_FRAME = re.compile(r"^(.+)\((\d+)\): (.+)$")
#: At most this many frames kept in a copy's stack, innermost first (as the tracer keeps).
MAX_FRAMES = 8
#: Trimmed paths of installed libraries are kept under this folder name, so that
#: paths.is_user_file, which looks for it, tells them from the user's own files.
LIBRARY_PREFIX = "site-packages"


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
        if _is_user_file(s.file):
            return s
    return sites[0] if sites else None


@lru_cache(maxsize=1024)
def _is_user_file(name: str) -> bool:
    """paths.is_user_file, asked once per file: the copies of a loop name the same ones."""
    return is_user_file(name)
