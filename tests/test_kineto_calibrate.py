"""`calibrate --from-trace` (run/calibrate_trace.py, kineto/timing.py): a hand-written
torch.profiler trace whose copies lie on lines of round numbers gives those lines back
exactly; the CLI writes a profile the cost model loads; and, where ../shared/kineto is here,
the fit to the real A100 alexnet trace holds to what its own large copies show."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from fractions import Fraction
from pathlib import Path

import pytest

from helpers import cli_in_process
from memcpy_doctor.core.costmodel import DeviceProfile, load_profile
from memcpy_doctor.run.calibrate import CalibrationError
from memcpy_doctor.run.calibrate_trace import fit_copy_path, fit_trace, trace_timings

SHARED = Path(__file__).resolve().parents[2] / "shared" / "kineto"


def _x(cat: str, name: str, ts: float, dur: float, **args) -> dict:
    return {"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": 1, "ts": ts, "dur": dur,
            "args": args}


def _dev(cat: str, name: str, ts: float, dur: float, corr: int, **args) -> dict:
    return {"ph": "X", "cat": cat, "name": name, "pid": 0, "tid": 7, "ts": ts, "dur": dur,
            "args": {"correlation": corr, "stream": 7, **args}}


#: (Kineto name, bytes, device us): pageable HtoD 1 us + 1 ns/B; pinned HtoD 2 us +
#: 0.1 ns/B; pageable DtoH 3 us + 0.5 ns/B; pinned DtoH too small to show a bandwidth.
COPIES = [("Memcpy HtoD (Pageable -> Device)", b, 1 + b / 1000) for b in (1000, 10_000,
                                                                          100_000, 1_000_000)]
COPIES += [("Memcpy HtoD (Pinned -> Device)", b, 2 + b / 10_000) for b in (10_000, 100_000,
                                                                           1_000_000)]
COPIES += [("Memcpy DtoH (Device -> Pageable)", b, 3 + b / 2000) for b in (2000, 20_000,
                                                                          200_000)]
COPIES += [("Memcpy DtoH (Device -> Pinned)", b, 2) for b in (4, 8)]


def calibration_trace() -> dict:
    events, t = [], 0.0
    for corr, (name, nbytes, us) in enumerate(COPIES, start=1):
        events += [_x("cuda_runtime", "cudaMemcpyAsync", t, 1, correlation=corr),
                   _dev("gpu_memcpy", name, t + 1, us, corr, bytes=nbytes)]
        t += 2000
    events += [  # an op that launches one kernel, two kernels, a 1 MB copy within the device
        _x("cpu_op", "aten::add_", t, 10), _x("cuda_runtime", "cudaLaunchKernel", t + 2, 4,
                                              correlation=100),
        _dev("kernel", "add", t + 6, 2, 100), _x("cuda_runtime", "cudaLaunchKernel", t + 20, 4,
                                                 correlation=101),
        _dev("kernel", "mm", t + 24, 300, 101),
        _x("cuda_runtime", "cudaDeviceSynchronize", t + 30, 295),  # waits for mm: not idle
        _x("cuda_runtime", "cudaDeviceSynchronize", t + 400, 7),  # idle: its latency
        _dev("gpu_memcpy", "Memcpy DtoD (Device -> Device)", t + 500, 1, 102, bytes=1_000_000),
    ]
    return {"schemaVersion": 1, "traceEvents": events, "deviceProperties": [{
        "name": "NVIDIA A100-SXM4-80GB", "totalGlobalMem": 80 << 30, "computeMajor": 8,
        "computeMinor": 0, "numSms": 108}]}


def test_copies_on_a_line_give_the_line_back():
    setup, slope = fit_copy_path([(1000, 2000), (10_000, 11_000), (100_000, 101_000)], 1e9)
    assert (setup, slope) == (1000, 1)
    setup, slope = fit_copy_path([(4, 2000), (8, 2000)], 4e9)  # no bandwidth to see:
    assert (setup, slope) == (Fraction(3997, 2), None)  # what is left after the base's


def test_the_fit_of_a_hand_written_trace_is_exact(tmp_path):
    path = tmp_path / "k.json"
    path.write_text(json.dumps(calibration_trace()))
    base = load_profile("a100-sxm4-80gb")
    profile, fits = fit_trace(trace_timings([str(path)]), base)
    assert [(f.path, f.events, f.setup_ns, f.bandwidth, f.time_error, f.median_error)
            for f in fits] == [
        ("HtoD_pinned", 3, 2000, 1e10, 0.0, 0.0), ("HtoD_pageable", 4, 1000, 1e9, 0.0, 0.0),
        ("DtoH_pinned", 2, 2000, None, 0.0, 4e-05),  # 2 us less 4 and 8 B at the base's 25 GB/s
        ("DtoH_pageable", 3, 3000, 2e9, 0.0, 0.0)]
    assert profile["copy_bandwidth"] == {
        "HtoD_pinned": 1e10, "HtoD_pageable": 1e9, "DtoH_pinned": 25e9,  # kept: not shown
        "DtoH_pageable": 2e9, "DtoD": 250e9}
    assert profile["copy_setup"] == {"HtoD_pinned": 2000, "HtoD_pageable": 1000,
                                     "DtoH_pinned": 2000, "DtoH_pageable": 3000}
    assert (profile["copy_setup_ns"], profile["sync_ns"], profile["launch_ns"],
            profile["kernel_min_ns"]) == (2000, 7000, 4000, 2000)
    assert profile["memory_bandwidth"] == 2e12  # 1 MB read and 1 MB written in 1 us
    assert (profile["name"], profile["total_memory_bytes"], profile["calibrated"]) == (
        "NVIDIA A100-SXM4-80GB", 80 << 30, True)
    assert profile["peak_flops"] == base.peak_flops
    assert "kept from NVIDIA A100-SXM4-80GB" in profile["sources"]["peak_flops"]
    assert profile["sources"]["copy_fit"].startswith(
        "HtoD_pinned: 3 events, 10000 to 1000000 B, setup 2000 ns, 10 GB/s; total time error "
        "+0.0%, median copy error 0.0%;")
    model = DeviceProfile.from_dict(profile)  # the format live calibration writes
    assert model.copy_ns("HtoD", 1_000_000, False) == 1_001_000


def test_traces_without_copies_or_from_two_devices_are_refused(tmp_path):
    cpu = tmp_path / "cpu.json"
    cpu.write_text(json.dumps({"traceEvents": [_x("cpu_op", "aten::add", 0, 5)]}))
    with pytest.raises(CalibrationError, match="no host<->device or peer copies"):
        trace_timings([str(cpu)])
    other = calibration_trace()
    other["deviceProperties"][0]["name"] = "NVIDIA L4"
    (tmp_path / "a.json").write_text(json.dumps(calibration_trace()))
    (tmp_path / "b.json").write_text(json.dumps(other))
    with pytest.raises(CalibrationError, match="fit one device at a time"):
        trace_timings([str(tmp_path / "a.json"), str(tmp_path / "b.json")])


def _cli(*args: object, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "memcpy_doctor", *map(str, args)], cwd=cwd,
                          capture_output=True, text=True, timeout=120)


def test_the_cli_writes_a_profile_from_a_trace(tmp_path):
    (tmp_path / "k.json.gz").write_bytes(gzip.compress(json.dumps(calibration_trace())
                                                       .encode()))
    r = _cli("calibrate", "--from-trace", "k.json.gz", "-o", "p.json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    lines = r.stderr.splitlines()
    assert lines[1] == ("memcpy-doctor: calibrate: HtoD_pageable: 4 events, 1000 to 1000000 "
                        "B, setup 1000 ns, 1 GB/s; total time error +0.0%, median copy error "
                        "0.0%")
    assert lines[-1] == ("memcpy-doctor: device profile of NVIDIA A100-SXM4-80GB written to "
                         "p.json")
    assert load_profile(str(tmp_path / "p.json")).copy_setup["DtoH_pageable"] == 3000
    # the first usage error as a user runs it (a subprocess), the others through main() here
    r = _cli("calibrate", "k.json.gz", cwd=tmp_path)
    assert r.returncode == 2 and "give --from-trace" in r.stderr and "Traceback" not in r.stderr
    for args, message in [(("calibrate", "--from-trace"), "give one or more"),
                          (("calibrate", "--from-trace", "nope.json"), "cannot read")]:
        r = cli_in_process(*args, cwd=tmp_path)
        assert r.status == 2 and message in r.err and "Traceback" not in r.err


@pytest.mark.skipif(not SHARED.is_dir(), reason="../shared/kineto is not here")
def test_the_alexnet_fit_holds_to_its_large_copies():
    path = os.fspath(SHARED / "a100_alexnet.json.gz")
    events = json.loads(gzip.decompress(Path(path).read_bytes()))["traceEvents"]
    large = [e for e in events if e.get("cat") == "gpu_memcpy" and e["args"]["bytes"] >= 16e6]
    shown = sum(e["args"]["bytes"] for e in large) / sum(e["dur"] * 1e-6 for e in large)
    profile, fits = fit_trace(trace_timings([path]), load_profile("a100-sxm4-80gb"))
    bandwidth = profile["copy_bandwidth"]["HtoD_pageable"]
    assert abs(bandwidth / shown - 1) < 0.10
    assert [f.path for f in fits] == ["HtoD_pageable"] and abs(fits[0].time_error) < 0.05
