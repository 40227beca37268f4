"""Paths as the user sees them, and whose code a file is: the user's, torch's or this package's.

One place decides "is this frame torch's or ours" for the tracer's call sites, the runner's
tracebacks and its signal handling.
"""

from __future__ import annotations

import getpass
import importlib.util
import os
import re
import sysconfig
import tempfile
from typing import Any


def _torch_dir() -> str:
    """torch's package directory, found as `import torch` would find it but without
    importing it (seconds and hundreds of MB that reading a saved trace does not need);
    where torch is not installed, a directory no file lies in."""
    spec = importlib.util.find_spec("torch")
    origin = spec.origin if spec is not None else None
    if not origin:
        return os.path.join(os.sep, "<torch not installed>") + os.sep
    return os.path.dirname(os.path.abspath(origin)) + os.sep


#: This package's directory and torch's, each with a trailing separator.
PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
TORCH_DIR = _torch_dir()
#: Where this interpreter's standard library and installed packages live.
_INSTALLED_DIRS = tuple(sorted({os.path.abspath(sysconfig.get_paths()[k]) + os.sep
                                for k in ("stdlib", "platstdlib", "purelib", "platlib")}))
#: Folders that hold installed packages, wherever an environment is.
_PACKAGE_FOLDERS = ("site-packages", "dist-packages")
#: Pseudo-files of the interpreter's machinery that runs a script or imports a module.
_INTERNAL_PSEUDO_FILES = ("<frozen runpy>", "<frozen importlib._bootstrap>",
                          "<frozen importlib._bootstrap_external>")
#: Code that torch.compile generates: an FX GraphModule's ("<eval_with_key>.3") and
#: Inductor's output code, in its cache folder (TORCHINDUCTOR_CACHE_DIR, else
#: torchinductor_USER in the temporary folder, as torch._inductor names it).
_GENERATED_PSEUDO_FILE = "<eval_with_key>"


def _inductor_cache_dir() -> str:
    configured = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    if configured:
        return os.path.abspath(configured) + os.sep
    try:
        user = getpass.getuser()
    except (KeyError, OSError):  # no user name: torch's own fallback
        user = "unknown"
    user = re.sub(r'[\\/:*?"<>|]', "_", user)
    return os.path.join(tempfile.gettempdir(), "torchinductor_" + user) + os.sep


_GENERATED_DIR = _inductor_cache_dir()


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


def diff_path(path: str, cwd: str | None = None) -> str:
    """`path` as a unified diff's header names it after "a/" and "b/": relative to `cwd`
    (default: the working directory), with "../" where it lies elsewhere."""
    if path.startswith("<"):
        return path
    try:
        return os.path.relpath(path, cwd or os.getcwd())
    except ValueError:  # another drive on Windows
        return path.lstrip(os.sep)


def format_site(site: Any, cwd: str | None = None, missing: str = "?") -> str:
    """A call site as `file:line`, its file shown as `short_path` shows it; `missing` for
    none."""
    return missing if site is None else f"{short_path(site.file, cwd)}:{site.line}"


def is_package_file(name: str) -> bool:
    """Code of this package."""
    return os.path.abspath(name).startswith(PACKAGE_DIR)


def is_torch_file(name: str) -> bool:
    """Code of torch."""
    return os.path.abspath(name).startswith(TORCH_DIR)


def is_internal_file(name: str) -> bool:
    """Code of torch, of this package or of the import machinery: never a user site."""
    if name.startswith("<"):
        return name in _INTERNAL_PSEUDO_FILES or name.startswith(_GENERATED_PSEUDO_FILE)
    return os.path.abspath(name).startswith((TORCH_DIR, PACKAGE_DIR, _GENERATED_DIR))


def is_user_file(name: str) -> bool:
    """The user's own code, where an edit may go: not torch's, this package's, the standard
    library's or an installed package's (anything under site-packages or dist-packages)."""
    if name.startswith("<"):
        return name not in _INTERNAL_PSEUDO_FILES and not name.startswith(_GENERATED_PSEUDO_FILE)
    path = os.path.abspath(name)
    if path.startswith((TORCH_DIR, PACKAGE_DIR, _GENERATED_DIR) + _INSTALLED_DIRS):
        return False
    return not any(folder in path.split(os.sep) for folder in _PACKAGE_FOLDERS)

