"""How paths are shown to the user: relative to the working directory when they lie below it."""

from __future__ import annotations

import os


def short_path(path: str, cwd: str | None = None) -> str:
    """`path` relative to `cwd` (default: the working directory) when it lies below it;
    pseudo-files such as "<stdin>" and paths elsewhere stay as they are."""
    if path.startswith("<"):
        return path
    cwd = cwd or os.getcwd()
    try:
        rel = os.path.relpath(path, cwd)
    except ValueError:  # another drive on Windows
        return path
    return path if rel == ".." or rel.startswith(".." + os.sep) else rel
