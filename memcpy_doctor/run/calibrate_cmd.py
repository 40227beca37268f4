"""`memcpy-doctor calibrate`: a device profile measured on this machine's GPU
(run/calibrate.py) or fitted to torch.profiler traces (run/calibrate_trace.py), with the
lines to say on the way. Nothing here prints: `say` gets them."""

from __future__ import annotations

from typing import Callable

from ..core.costmodel import load_profile
from . import calibrate as calib
from . import calibrate_trace as fit


def calibrated_profile(traces: list[str], from_trace: bool, quick: bool,
                       say: Callable[[str], None]) -> tuple[dict, dict]:
    """(the profile, the measurements it came from); CalibrationError when there is no GPU
    to measure or nothing in the traces to fit."""
    if from_trace:
        measured = fit.trace_timings(traces)
        base = load_profile(calib.base_profile_name(measured["device"].get("name", "")))
        profile, fits = fit.fit_trace(measured, base)
        for line in fit.fit_lines(fits):
            say(f"memcpy-doctor: calibrate: {line}")
        return profile, measured
    measured = calib.measure(quick, lambda msg: say(f"memcpy-doctor: calibrate: {msg}"))
    base = load_profile(calib.base_profile_name(measured["device"]["name"]))
    return calib.build_profile(measured, base), measured
