"""`calibrate --from-trace` (run/calibrate_trace.py, kineto/timing.py): a hand-written
torch.profiler trace whose copies lie on lines of round numbers gives those lines back
exactly; copies within one device give the memory bandwidth, peer copies the DtoD path, and
neither the other's; the CLI writes a profile the cost model loads, from a trace of copies
within the device alone too; and, where ../shared/kineto is here, the fit to the real A100
alexnet trace holds to what its own large copies show."""

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
from memcpy_doctor.run.calibrate_trace import (Fit, fit_copy_path, fit_lines, fit_trace,
                                               trace_timings)

SHARED = Path(__file__).resolve().parents[2] / "shared" / "kineto"


def _x(cat: str, name: str, ts: float, dur: float, **args) -> dict:
    return {"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": 1, "ts": ts, "dur": dur,
            "args": args}


def _dev(cat: str, name: str, ts: float, dur: float, corr: int, **args) -> dict:
    return {"ph": "X", "cat": cat, "name": name, "pid": 0, "tid": 7, "ts": ts, "dur": dur,
            "args": {"correlation": corr, "stream": 7, **args}}


#: (Kineto name, bytes, device us): pageable HtoD 1 us + 1 ns/B; pinned HtoD 2 us +
#: 0.1 ns/B; pageable DtoH 3 us + 0.5 ns/B; pinned DtoH too small to show a bandwidth;
#: within the device 2 us (the shortest kernel's) + 1 ns per 1000 B.
COPIES = [("Memcpy HtoD (Pageable -> Device)", b, 1 + b / 1000) for b in (1000, 10_000,
                                                                          100_000, 1_000_000)]
COPIES += [("Memcpy HtoD (Pinned -> Device)", b, 2 + b / 10_000) for b in (10_000, 100_000,
                                                                           1_000_000)]
COPIES += [("Memcpy DtoH (Device -> Pageable)", b, 3 + b / 2000) for b in (2000, 20_000,
                                                                          200_000)]
COPIES += [("Memcpy DtoH (Device -> Pinned)", b, 2) for b in (4, 8)]
COPIES += [("Memcpy DtoD (Device -> Device)", b, us) for b, us in ((100_000, 2.1),
                                                                   (1_000_000, 3),
                                                                   (10_000_000, 12))]
LOCAL_NAME = "Memcpy DtoD (Device -> Device)"


def calibration_trace() -> dict:
    events, t = [], 0.0
    for corr, (name, nbytes, us) in enumerate(COPIES, start=1):
        events += [_x("cuda_runtime", "cudaMemcpyAsync", t, 1, correlation=corr),
                   _dev("gpu_memcpy", name, t + 1, us, corr, bytes=nbytes)]
        t += 2000
    events += [  # an op that launches one kernel, two kernels, and two syncs
        _x("cpu_op", "aten::add_", t, 10), _x("cuda_runtime", "cudaLaunchKernel", t + 2, 4,
                                              correlation=100),
        _dev("kernel", "add", t + 6, 2, 100), _x("cuda_runtime", "cudaLaunchKernel", t + 20, 4,
                                                 correlation=101),
        _dev("kernel", "mm", t + 24, 300, 101),
        _x("cuda_runtime", "cudaDeviceSynchronize", t + 30, 295),  # waits for mm: not idle
        _x("cuda_runtime", "cudaDeviceSynchronize", t + 400, 7),  # idle: its latency
    ]
    return _trace(events)


def _trace(events: list[dict], name: str = "NVIDIA A100-SXM4-80GB") -> dict:
    return {"schemaVersion": 1, "traceEvents": events, "deviceProperties": [{
        "name": name, "totalGlobalMem": 80 << 30, "computeMajor": 8, "computeMinor": 0,
        "numSms": 108}]}


def copies_trace(copies: list[tuple[str, int, float]], *kernels_us: float,
                 name: str = "NVIDIA A100-SXM4-80GB") -> dict:
    """A trace of `copies` (Kineto name, bytes, device us), one every 100 us, then kernels."""
    events = [_dev("gpu_memcpy", n, 100 * i, us, i, bytes=b)
              for i, (n, b, us) in enumerate(copies, start=1)]
    events += [_dev("kernel", "k", 100 * (len(copies) + i), us, 10**6 + i)
               for i, us in enumerate(kernels_us, start=1)]
    return _trace(events, name)


#: 1600 copies within one device, 400 of each size, on 1 us + 1 ns per 1000 B (1 TB/s).
LOCAL_ONLY = [(LOCAL_NAME, b, us) for b, us in ((1000, 1.001), (100_000, 1.1),
                                                 (1_000_000, 2), (10_000_000, 11))] * 400


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
        ("DtoH_pageable", 3, 3000, 2e9, 0.0, 0.0), ("DtoD_local", 3, 2000, 1e12, 0.0, 0.0)]
    assert profile["copy_bandwidth"] == {
        "HtoD_pinned": 1e10, "HtoD_pageable": 1e9, "DtoH_pinned": 25e9,  # kept: not shown
        "DtoH_pageable": 2e9, "DtoD": 250e9}
    assert profile["copy_setup"] == {"HtoD_pinned": 2000, "HtoD_pageable": 1000,
                                     "DtoH_pinned": 2000, "DtoH_pageable": 3000}
    assert (profile["copy_setup_ns"], profile["sync_ns"], profile["launch_ns"],
            profile["kernel_min_ns"]) == (2000, 7000, 4000, 2000)
    assert profile["memory_bandwidth"] == 2e12  # copied at 1 TB/s: read and written
    assert (profile["name"], profile["total_memory_bytes"], profile["calibrated"]) == (
        "NVIDIA A100-SXM4-80GB", 80 << 30, True)
    assert profile["peak_flops"] == base.peak_flops
    assert "kept from NVIDIA A100-SXM4-80GB" in profile["sources"]["peak_flops"]
    assert profile["sources"]["copy_fit"].startswith(
        "HtoD_pinned: 3 events, 10000 to 1000000 B, setup 2000 ns, 10 GB/s; total time error "
        "+0.0%, median copy error 0.0%;")
    assert profile["sources"]["copy_fit"].endswith(
        "; DtoD_local: 3 events, 100000 to 10000000 B, setup 2000 ns, 1 TB/s (memory_bandwidth "
        "2 TB/s); total time error +0.0%, median copy error 0.0%")
    model = DeviceProfile.from_dict(profile)  # the format live calibration writes
    assert model.copy_ns("HtoD", 1_000_000, False) == 1_001_000
    assert model.kernel_ns(0, 2 * 10_000_000, None) == 12_000  # as the trace's copy took


def test_copies_within_the_device_alone_fit_its_memory_and_keep_the_rest(tmp_path):
    path = tmp_path / "k.json"
    path.write_text(json.dumps(copies_trace(LOCAL_ONLY)))
    base = load_profile("a100-sxm4-80gb")
    profile, fits = fit_trace(trace_timings([str(path)]), base)
    assert fits == [Fit("DtoD_local", 1600, 1000, 10_000_000, 1000, 1e12, 0.0, 0.0)]
    assert (profile["memory_bandwidth"], profile["kernel_min_ns"]) == (2e12, 1000)
    # no kernels: the copies' setup, which the model prices as a kernel's
    assert profile["copy_bandwidth"] == base.copy_bandwidth  # DtoD, a peer copy: kept
    assert (profile["copy_setup"], profile["copy_setup_ns"]) == ({}, base.copy_setup_ns)
    assert (profile["launch_ns"], profile["sync_ns"]) == (base.launch_ns, base.sync_ns)
    src = profile["sources"]
    assert src["copy_bandwidth"].endswith(
        "(none); not in the trace, kept from NVIDIA A100-SXM4-80GB: HtoD_pinned, "
        "HtoD_pageable, DtoH_pinned, DtoH_pageable, DtoD; DtoD is a peer copy between GPUs "
        "(Memcpy PtoP): the 1600 copies within the device (Memcpy DtoD) are priced with "
        "memory_bandwidth instead")
    assert src["memory_bandwidth"].endswith(": twice the least-squares bandwidth of 1600 "
                                            "copies within the device (Memcpy DtoD): each "
                                            "reads and writes every byte, and the model prices "
                                            "one as a kernel, kernel_min_ns + bytes read and "
                                            "written / memory_bandwidth")
    assert "no kernels in the trace: the setup of its 1600 copies" in src["kernel_min_ns"]
    assert src["copy_setup"] == ("no host<->device or peer copies in the trace: every path "
                                 "uses copy_setup_ns")
    for key in ("launch_ns", "sync_ns", "copy_setup_ns", "peak_flops"):
        assert src[key].startswith("not in the trace, kept from NVIDIA A100-SXM4-80GB: ")
    model = DeviceProfile.from_dict(profile)
    assert [model.kernel_ns(0, 2 * b, None) for b in (1000, 10_000_000)] == [1001, 11_000]


def test_peer_copies_fit_dtod_and_copies_within_the_device_the_memory(tmp_path):
    """Each kind fits its own figure: peer 2 us + 1 ns per 100 B, within the device 2 us + 1
    ns per 1000 B; the kernel of 1 us is the setup the model prices the latter with."""
    path = tmp_path / "k.json"
    path.write_text(json.dumps(copies_trace([
        ("Memcpy PtoP (Device -> Device)", 100_000, 3), ("Memcpy PtoP (Device -> Device)",
                                                         1_000_000, 12),
        (LOCAL_NAME, 1_000_000, 3), (LOCAL_NAME, 10_000_000, 12)], 1)))
    base = load_profile("a100-sxm4-80gb")
    profile, fits = fit_trace(trace_timings([str(path)]), base)
    assert fits == [Fit("DtoD", 2, 100_000, 1_000_000, 2000, 1e11, 0.0, 0.0),
                    Fit("DtoD_local", 2, 1_000_000, 10_000_000, 2000, 1e12, -2 / 15, 5 / 24,
                        1000)]  # priced 1 us short: 2 us of 15 over both, 1/3 and 1/12 each
    assert profile["copy_bandwidth"] == {**base.copy_bandwidth, "DtoD": 1e11}
    assert (profile["copy_setup"], profile["copy_setup_ns"]) == ({"DtoD": 2000}, 2000)
    assert (profile["memory_bandwidth"], profile["kernel_min_ns"]) == (2e12, 1000)
    assert "peer copy" not in profile["sources"]["copy_bandwidth"]  # DtoD fitted: nothing to say
    assert fit_lines(fits)[1] == (
        "DtoD_local: 2 events, 1000000 to 10000000 B, setup 2000 ns (priced at kernel_min_ns, "
        "1000 ns), 1 TB/s (memory_bandwidth 2 TB/s); total time error -13.3%, median copy "
        "error 20.8%")


def test_copies_within_the_device_too_small_keep_its_memory_bandwidth(tmp_path):
    path = tmp_path / "k.json"
    path.write_text(json.dumps(copies_trace([(LOCAL_NAME, 4, 1), (LOCAL_NAME, 8, 1)])))
    base = load_profile("a100-sxm4-80gb")
    profile, fits = fit_trace(trace_timings([str(path)]), base)
    assert (fits[0].bandwidth, profile["memory_bandwidth"]) == (None, base.memory_bandwidth)
    assert profile["sources"]["memory_bandwidth"].startswith(
        "kept from NVIDIA A100-SXM4-80GB, the 2 copies within the device too small to show it: ")


def test_traces_without_copies_or_from_two_devices_are_refused(tmp_path):
    cpu = tmp_path / "cpu.json"
    cpu.write_text(json.dumps({"traceEvents": [_x("cpu_op", "aten::add", 0, 5)]}))
    with pytest.raises(CalibrationError, match="no copies to fit"):
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


def test_the_cli_fits_a_trace_of_copies_within_the_device_alone(tmp_path):
    (tmp_path / "d.json").write_text(json.dumps(copies_trace(LOCAL_ONLY,
                                                             name="NVIDIA H100 80GB HBM3")))
    r = _cli("calibrate", "--from-trace", "d.json", "-o", "p.json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stderr.splitlines() == [
        "memcpy-doctor: calibrate: DtoD_local: 1600 events, 1000 to 10000000 B, setup 1000 ns, "
        "1 TB/s (memory_bandwidth 2 TB/s); total time error +0.0%, median copy error 0.0%",
        "memcpy-doctor: device profile of NVIDIA H100 80GB HBM3 written to p.json"]
    profile = load_profile(str(tmp_path / "p.json"))
    h100 = load_profile("h100-sxm5-80gb")  # the base: the shipped profile of that name
    assert (profile.memory_bandwidth, profile.kernel_min_ns) == (2e12, 1000)
    assert profile.copy_bandwidth == h100.copy_bandwidth  # its peer DtoD (375 GB/s) kept
    # a trace with no copies at all: one line, status 2
    (tmp_path / "n.json").write_text(json.dumps(copies_trace([], 5)))
    r = cli_in_process("calibrate", "--from-trace", "n.json", cwd=tmp_path)
    assert (r.status, r.err) == (2, "memcpy-doctor: error: n.json: no copies to fit "
                                    "(gpu_memcpy events between host and device, between "
                                    "GPUs or within one)\n")


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
