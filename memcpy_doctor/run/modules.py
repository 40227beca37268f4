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
from typing import Any, Iterator, Mapping


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


def module_spec_or_error(name: str) -> ModuleSpec:
    """main_spec, with its error as the command line says it: ValueError "-m NAME: why"."""
    try:
        return main_spec(name)
    except ModuleTargetError as e:
        raise ValueError(f"-m {name}: {e}") from None


def program(module: str | None, script: str | None,
            args: tuple[str, ...]) -> tuple[str, tuple[str, ...]]:
    """`profile`'s program: (SCRIPT or MODULE, its arguments); ValueError, one line as click
    words it, for a SCRIPT that is not a file, or for neither."""
    if module is not None:
        return module, ((script,) if script is not None else ()) + args
    if script is None:
        raise ValueError("missing SCRIPT (or -m MODULE): the program to profile")
    if not os.path.isfile(script):
        why = "is a directory" if os.path.isdir(script) else "does not exist"
        raise ValueError(f"Invalid value for 'SCRIPT': File {script!r} {why}.")
    return script, args


def module_argv(argv: list[str], commands: Mapping[str, Any]) -> list[str]:
    """`profile [OPTIONS] -m MODULE ARGS...` with `--` put after MODULE, so that ARGS are the
    module's even where they look like options, as after `python -m MODULE`; and
    `explain --verify -m MODULE` as `explain --verify-module MODULE`. `commands`: the CLI's
    commands by name (click's), for which of their options take a value."""
    if not argv or argv[0] not in ("profile", "explain"):
        return argv
    valued = {o for p in commands[argv[0]].params
              if hasattr(p, "is_flag") and not p.is_flag and not p.count for o in p.opts}
    out, i = [argv[0]], 1
    while i < len(argv):
        token = argv[i]
        if token == "--" or not token.startswith("-") or token == "-":
            break  # the program (or the traces) from here on
        if argv[0] == "explain" and token == "--verify" and argv[i + 1:i + 2] == ["-m"]:
            return out + ["--verify-module", *argv[i + 2:]]
        if argv[0] == "profile" and token in ("-m", "--module") and i + 1 < len(argv):
            return out + [token, argv[i + 1], "--", *argv[i + 2:]]
        if argv[0] == "profile" and token.startswith(("--module=", "-m")) and token != "-m":
            return out + [token, "--", *argv[i + 1:]]
        out.append(token)
        if token in valued:  # its value follows
            out += argv[i + 1:i + 2]
            i += 1
        i += 1
    return out + argv[i:]
