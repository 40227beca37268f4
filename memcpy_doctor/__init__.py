"""memcpy-doctor: find the copies between host and GPU that stall a PyTorch program.

    import memcpy_doctor
    with memcpy_doctor.profiler() as prof:
        train_step()
    print(memcpy_doctor.render_text(prof.trace))

The library never prints; the `memcpy-doctor` command does.
"""

from .core import __version__
from .api import profiler
from .guards.device import device_guard
from .render.text import render_text
from .core.trace import Trace, TraceError, load_trace
from .guards.transfer import TransferGuardError, transfer_guard
from .tracer import Tracer
from .tracer.optable import register_sync_op

__all__ = ["device_guard", "transfer_guard", "TransferGuardError", "profiler",
           "Tracer", "Trace", "TraceError", "load_trace", "render_text",
           "register_sync_op", "__version__"]
