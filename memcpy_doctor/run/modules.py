"""`profile -m MODULE`: the module `python -m MODULE` would run, found the way it finds it.

Python looks the module up with the current directory first on `sys.path`, imports its
parent packages (their `__init__` runs, before the module), and runs a package's `__main__`
submodule for a package. The module then runs as `__main__` with `sys.argv[0]` its file,
`__spec__` its spec and `__package__` its parent, so that its relative imports work
(runpy's `_run_module_as_main`). `main_spec` finds that spec before the tracer starts, so a
module that does not exist is a usage error, as a missing script is; the parent packages'
imports are therefore not traced.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import sys
from importlib.machinery import ModuleSpec
from typing import Iterator


class ModuleTargetError(ValueError):
    """MODULE names nothing `python -m` could run; the message says why, in Python's words
    where it has them."""


def main_spec(name: str) -> ModuleSpec:
    """The spec of the module `python -m name` runs (a package's `__main__`), with the
    current directory first on `sys.path` while it is looked up. ModuleTargetError when
    there is none, or when it is not Python source (memcpy-doctor compiles the module's
    source itself, to apply `--apply` edits)."""
    if not name or name.startswith("."):
        raise ModuleTargetError(f"{name!r}: relative module names are not supported")
    spec = _find(name)
    if spec.submodule_search_locations is not None:  # a package: its __main__
        if name == "__main__" or name.endswith(".__main__"):
            raise ModuleTargetError(f"{name}: cannot use package as __main__ module")
        try:
            spec = _find(f"{name}.__main__")
        except ModuleTargetError:
            raise ModuleTargetError(f"no module named {name}.__main__; {name!r} is a package "
                                    "and cannot be directly executed") from None
    origin = spec.origin
    if not origin or not origin.endswith(".py") or not os.path.isfile(origin):
        raise ModuleTargetError(f"{spec.name}: not a Python source file ({origin}); "
                                "memcpy-doctor runs a module from its source")
    return spec


def _find(name: str) -> ModuleSpec:
    try:
        with cwd_first():
            spec = importlib.util.find_spec(name)
    except ImportError as e:  # a parent package missing, or its import failing
        raise ModuleTargetError(f"error while finding module specification for {name!r} "
                                f"({type(e).__name__}: {e})") from None
    if spec is None:
        raise ModuleTargetError(f"no module named {name}")
    return spec


@contextlib.contextmanager
def cwd_first() -> Iterator[None]:
    """`sys.path[0]` as `python -m` has it (the current directory) for the block."""
    saved = sys.path[0] if sys.path else None
    if sys.path:
        sys.path[0] = os.getcwd()
    else:
        sys.path.insert(0, os.getcwd())
    try:
        yield
    finally:
        if saved is not None:
            sys.path[0] = saved
