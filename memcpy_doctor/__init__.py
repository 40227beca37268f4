"""memcpy-doctor: find the copies between host and GPU that stall a PyTorch program.

    import memcpy_doctor
    with memcpy_doctor.profiler() as prof:
        train_step()
    print(memcpy_doctor.render_text(prof.trace))

The library never prints; the `memcpy-doctor` command does.

Each public name is imported on first use (PEP 562), not here: the tracer and the guards
need torch, which takes a second and hundreds of MB to import, and the commands that only
read a saved trace (report, check, explain, diff) never need it.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from .core import __version__

if TYPE_CHECKING:  # what the names below are, for type checkers and readers
    from .api import profiler
    from .core.trace import Trace, TraceError, load_trace
    from .guards.device import device_guard
    from .guards.transfer import TransferGuardError, transfer_guard
    from .render.text import render_text
    from .tracer import Tracer
    from .tracer.optable import register_sync_op

#: Each public name, and the module it is imported from on first use.
_PUBLIC = {
    "profiler": ".api",
    "device_guard": ".guards.device",
    "transfer_guard": ".guards.transfer",
    "TransferGuardError": ".guards.transfer",
    "Tracer": ".tracer",
    "Trace": ".core.trace",
    "TraceError": ".core.trace",
    "load_trace": ".core.trace",
    "render_text": ".render.text",
    "register_sync_op": ".tracer.optable",
}

__all__ = [*_PUBLIC, "__version__"]


def __getattr__(name: str) -> Any:
    """A public name, imported from its module the first time it is asked for and kept
    here, so that later uses cost a plain attribute read."""
    module = _PUBLIC.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value
    return value


def load_ipython_extension(ipython: Any) -> None:
    """`%load_ext memcpy_doctor` in IPython or Jupyter: the `%memcpy_doctor` and
    `%%memcpy_doctor` magics (memcpy_doctor/run/ipython.py)."""
    from .run.ipython import load_ipython_extension as load
    load(ipython)


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
