"""memcpy-doctor: find the copies between host and GPU that stall a PyTorch program.

    import memcpy_doctor
    with memcpy_doctor.profiler() as prof:
        train_step()
    print(memcpy_doctor.render_text(prof.trace))

The library never prints; the `memcpy-doctor` command does.
"""

__version__ = "0.1.0"

from .api import profiler  # noqa: E402
from .guard import device_guard  # noqa: E402
from .render.text import render_text  # noqa: E402
from .trace import Trace, TraceError, load_trace  # noqa: E402
from .transfer_guard import TransferGuardError, transfer_guard  # noqa: E402
from .tracer import Tracer  # noqa: E402

__all__ = ["device_guard", "transfer_guard", "TransferGuardError", "profiler",
           "Tracer", "Trace", "TraceError", "load_trace", "render_text",
           "__version__"]
