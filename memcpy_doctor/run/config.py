"""`[tool.memcpy-doctor]` in pyproject.toml: a repository keeps its copy budget beside its code.

    [tool.memcpy-doctor]
    max = { sync_calls = 0, memcpy_ratio = "5%" }
    tolerance = "10%"            # or { sync_calls = "0%", bytes_htod = "10%" }
    allow = ["src/data.py:42", "tools/*.py"]
    baseline = "ci/memcpy-baseline.json"

Command-line options add to (and for the same metric, override) what the file says.
"""

from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass, field
from typing import Any

from ..analysis.gates import GateError, METRICS, parse_threshold, parse_tolerance


@dataclass
class GateConfig:
    limits: dict[str, float] = field(default_factory=dict)
    tolerance: dict[str | None, float] = field(default_factory=dict)
    allow: list[str] = field(default_factory=list)
    baseline: str | None = None
    root: str = "."  # paths in allow-lists and output are relative to this
    source: str | None = None  # the pyproject.toml read, if any

    @property
    def active(self) -> bool:
        return bool(self.limits or self.baseline)


def find_pyproject(start: str) -> str | None:
    """The nearest pyproject.toml in `start` or a folder above it."""
    path = os.path.abspath(start)
    while True:
        candidate = os.path.join(path, "pyproject.toml")
        if os.path.isfile(candidate):
            return candidate
        parent = os.path.dirname(path)
        if parent == path:
            return None
        path = parent


def _str(value: Any) -> str:
    return value if isinstance(value, str) else str(value)


def load_config(start: str, path: str | None = None) -> GateConfig:
    """Read `[tool.memcpy-doctor]` from `path`, or from the nearest pyproject.toml."""
    path = path or find_pyproject(start)
    config = GateConfig(root=os.path.abspath(start))
    if path is None:
        return config
    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except (OSError, tomllib.TOMLDecodeError) as e:
        raise GateError(f"{path}: cannot read ({e})") from None
    table = data.get("tool", {}).get("memcpy-doctor")
    if table is None:
        return config
    config.source = path
    config.root = os.path.dirname(os.path.abspath(path))
    if not isinstance(table, dict):
        raise GateError(f"{path}: [tool.memcpy-doctor] must be a table")
    unknown = set(table) - {"max", "tolerance", "allow", "baseline"}
    if unknown:
        raise GateError(f"{path}: unknown key(s) in [tool.memcpy-doctor]: "
                        f"{', '.join(sorted(unknown))}")
    limits = table.get("max", {})
    if not isinstance(limits, dict):
        raise GateError(f"{path}: max must be a table of METRIC = LIMIT")
    for name, value in limits.items():
        key, limit = parse_threshold(f"{name}={_str(value)}")
        config.limits[key] = limit
    tol = table.get("tolerance")
    if isinstance(tol, dict):
        for name, value in tol.items():
            if name not in METRICS:
                raise GateError(f"{path}: unknown metric {name!r} in tolerance")
            config.tolerance[name] = parse_tolerance(_str(value))[1]
    elif tol is not None:
        config.tolerance[None] = parse_tolerance(_str(tol))[1]
    allow = table.get("allow", [])
    if not isinstance(allow, list) or not all(isinstance(a, str) for a in allow):
        raise GateError(f"{path}: allow must be a list of strings")
    config.allow = list(allow)
    baseline = table.get("baseline")
    if baseline is not None:
        config.baseline = os.path.join(config.root, _str(baseline))
    return config


def merge(config: GateConfig, limits: tuple[str, ...], tolerances: tuple[str, ...],
          allow: tuple[str, ...], baseline: str | None) -> GateConfig:
    """The file's settings with the command line's on top."""
    for text in limits:
        name, value = parse_threshold(text)
        config.limits[name] = value
    for text in tolerances:
        name, value = parse_tolerance(text)
        config.tolerance[name] = value
    config.allow += list(allow)
    if baseline is not None:
        config.baseline = baseline
    return config
