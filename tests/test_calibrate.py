"""Calibration: the fit from hand-made measurements with round numbers (exact results), the
profile it builds and the simulated GPU using it, the shipped profiles, and the CLI without a
GPU. The measuring half runs only on a real GPU (cuda-marked)."""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys
from fractions import Fraction

import pytest
import torch

from helpers import cli_in_process
from memcpy_doctor.run import calibrate as calib
from memcpy_doctor.core.costmodel import (DeviceProfile, ProfileError, available_profiles,
                                          load_profile)
from memcpy_doctor.tracer import Tracer

ROOT = pathlib.Path(__file__).resolve().parent.parent
SIZES = (1_000, 100_000, 10_000_000)
STAMP = "measured by memcpy-doctor calibrate on Round GPU, torch 2.13.0, 2026-01-02"

#: path -> (intercept ns, bytes per ns): intercepts include the 5 us sync latency.
LINES = {"HtoD_pinned": (15_000, 20), "HtoD_pageable": (25_000, 10),
         "DtoH_pinned": (13_000, 25), "DtoH_pageable": (45_000, 5)}


def copy_records() -> list[dict]:
    """Three samples per size: the median lies on the line, the others around it."""
    records = []
    for path, (a, rate) in LINES.items():
        for size in SIZES:
            ns = a + size // rate
            records += [{"path": path, "bytes": size, "ns": t} for t in (ns + 300, ns, ns - 100)]
    return records


def measurements() -> dict:
    return {
        "device": {"name": "Round GPU", "total_memory_bytes": 16 * 2**30,
                   "compute_capability": [9, 0], "multi_processor_count": 100},
        "torch_version": "2.13.0", "date": "2026-01-02", "allow_tf32": False,
        "sync_ns": [6_000, 4_000, 5_000],
        "launch_ns": [3_000, 4_000, 9_000],
        "kernel_min_ns": [1_500, 1_500, 2_500],
        "copies": copy_records(),
        "matmul": [{"dtype": "float32", "n": 1000, "ns": 1_000_000},
                   {"dtype": "float32", "n": 1000, "ns": 2_000_000},
                   {"dtype": "float16", "n": 2000, "ns": 1_000_000}],
        "memory": [{"bytes": 2_000_000_000, "ns": 1_000_000},
                   {"bytes": 2_000_000_000, "ns": 4_000_000}],
    }


# ----- fit_line -----

def test_fit_line_gives_the_line_back_exactly():
    assert calib.fit_line([(0, 10_000), (1_000, 60_000), (3_000, 160_000)]) == (
        Fraction(10_000), Fraction(50))


def test_fit_line_weighs_by_relative_error():
    # Three points on y = 10,000 + x, a fourth 2% high at 100 MB: the setup stays within 1%
    # (unweighted least squares gives 9,260, 7% off), the slope within 2%.
    a, b = calib.fit_line([(1_000, 11_000), (10_000, 20_000), (100_000, 110_000),
                           (100_000_000, 102_010_200)])
    assert abs(a - 10_000) < 100 and abs(b - 1) < Fraction(2, 100)


@pytest.mark.parametrize("points, message", [
    ([(100, 5), (100, 6)], "two or more sizes"),
    ([(1, 5), (2, 0)], "positive times"),
])
def test_fit_line_refuses_what_it_cannot_fit(points, message):
    with pytest.raises(calib.CalibrationError, match=message):
        calib.fit_line(points)


# ----- fit_copies, matmul, memory -----

def test_fit_copies_setup_is_the_intercept_less_sync():
    assert calib.fit_copies(copy_records(), sync_ns=5_000) == {
        "DtoH_pageable": (40_000, 5e9), "DtoH_pinned": (8_000, 25e9),
        "HtoD_pageable": (20_000, 10e9), "HtoD_pinned": (10_000, 20e9)}


def test_fit_copies_setup_never_below_zero():
    records = [{"path": "HtoD_pinned", "bytes": s, "ns": 1_000 + s} for s in SIZES]
    assert calib.fit_copies(records, sync_ns=5_000) == {"HtoD_pinned": (0, 1e9)}


def test_fit_copies_times_that_do_not_grow_are_an_error():
    records = [{"path": "DtoH_pinned", "bytes": s, "ns": 100_000 - s // 1000} for s in SIZES]
    with pytest.raises(calib.CalibrationError, match="DtoH_pinned.*do not grow"):
        calib.fit_copies(records, sync_ns=0)


def test_fit_copies_one_size_is_an_error():
    with pytest.raises(calib.CalibrationError, match="HtoD_pageable: .*two or more sizes"):
        calib.fit_copies([{"path": "HtoD_pageable", "bytes": 10, "ns": 5}], sync_ns=0)


def test_best_matmul_flops_and_bandwidth():
    m = measurements()
    assert calib.best_matmul_flops(m["matmul"]) == {"float32": 2e12, "float16": 16e12}
    assert calib.best_bandwidth(m["memory"]) == 2e12


# ----- build_profile -----

def test_build_profile_figures():
    base = load_profile("a100-sxm4-80gb")
    d = calib.build_profile(measurements(), base)
    d.pop("sources")  # checked in the next test
    assert d == {
        "name": "Round GPU", "calibrated": True, "total_memory_bytes": 16 * 2**30,
        "compute_capability": [9, 0], "multi_processor_count": 100,
        "peak_flops": {"float64": 9.7e12, "float32": 2e12, "float16": 16e12,
                       "bfloat16": 312e12, "other": 2e12},
        "memory_bandwidth": 2e12,
        "copy_bandwidth": {"HtoD_pinned": 20e9, "HtoD_pageable": 10e9, "DtoH_pinned": 25e9,
                           "DtoH_pageable": 5e9, "DtoD": 250e9},
        "launch_ns": 4_000, "kernel_min_ns": 1_500, "sync_ns": 5_000,
        "copy_setup_ns": 15_000,  # median of 8, 10, 20 and 40 us
        "copy_setup": {"DtoH_pageable": 40_000, "DtoH_pinned": 8_000,
                       "HtoD_pageable": 20_000, "HtoD_pinned": 10_000},
    }
    assert json.loads(json.dumps(d)) == d


def test_build_profile_cites_every_figure():
    d = calib.build_profile(measurements(), load_profile())
    figures = set(d) - {"name", "calibrated", "sources"}
    assert figures <= set(d["sources"])
    for figure in figures:
        assert d["sources"][figure].startswith(STAMP + ": "), figure
    assert "kept from NVIDIA A100-SXM4-80GB: DtoD" in d["sources"]["copy_bandwidth"]
    assert "1000 to 10000000 bytes" in d["sources"]["copy_bandwidth"]
    assert d["sources"]["peak_flops"].endswith(
        "not measured, kept from NVIDIA A100-SXM4-80GB: float64, bfloat16")
    assert "allow_tf32=False" in d["sources"]["peak_flops"]


def test_built_profile_loads_and_prices_copies_per_path(tmp_path):
    path = tmp_path / "round.json"
    path.write_text(json.dumps(calib.build_profile(measurements(), load_profile())))
    p = load_profile(str(path))
    assert p.calibrated and p.name == "Round GPU"
    assert p.copy_ns("HtoD", 100_000, True) == 10_000 + 5_000
    assert p.copy_ns("HtoD", 100_000, False) == 20_000 + 10_000
    assert p.copy_ns("DtoH", 100_000, None) == 40_000 + 20_000
    assert p.copy_ns("DtoD", 250_000, None) == 15_000 + 1_000  # DtoD: the shared setup


def test_the_simulated_gpu_uses_a_calibrated_profile(tmp_path):
    path = tmp_path / "round.json"
    path.write_text(json.dumps(calib.build_profile(measurements(), load_profile())))
    with Tracer(device="sim", profile=str(path)) as tracer:
        h = torch.ones(25_000)  # 100,000 bytes, pageable
        h.to("cuda")
    trace = tracer.trace
    assert trace.meta.device_name == "Round GPU"
    (copy,) = trace.copies
    assert (copy.direction, copy.sync, copy.pinned, copy.bytes) == ("HtoD", True, False, 100_000)
    assert copy.device_ns == 20_000 + 10_000


def test_base_profile_name_matches_the_device_name():
    assert calib.base_profile_name("NVIDIA H100 80GB HBM3") == "h100-sxm5-80gb"
    assert calib.base_profile_name("NVIDIA GeForce RTX 4090") == "rtx-4090"
    assert calib.base_profile_name("Some Future GPU") == "a100-sxm4-80gb"


# ----- profile format -----

def test_profiles_without_copy_setup_still_load():
    d = load_profile().to_dict()
    del d["copy_setup"]
    p = DeviceProfile.from_dict(d)
    assert p.copy_setup == {} and p.copy_ns("HtoD", 0, True) == p.copy_setup_ns


def test_profile_missing_a_copy_path_is_a_profile_error():
    d = load_profile().to_dict()
    del d["copy_bandwidth"]["DtoH_pinned"]
    with pytest.raises(ProfileError, match="copy_bandwidth has no 'DtoH_pinned'"):
        DeviceProfile.from_dict(d)


# ----- shipped profiles -----

FIGURES = ("peak_flops", "memory_bandwidth", "copy_bandwidth", "launch_ns", "kernel_min_ns",
           "copy_setup_ns", "sync_ns", "total_memory_bytes", "compute_capability",
           "multi_processor_count")


def test_shipped_profiles():
    assert available_profiles() == ["a100-sxm4-80gb", "h100-sxm5-80gb", "h200-sxm-141gb",
                                    "l4", "rtx-4090"]


@pytest.mark.parametrize("name", available_profiles())
def test_every_shipped_profile_loads_with_a_source_per_figure(name):
    p = load_profile(name)
    assert not p.calibrated  # datasheet figures: calibrate to measure them
    for figure in FIGURES:
        assert p.sources.get(figure, "").strip(), f"{name}: no source for {figure}"
    assert set(p.copy_bandwidth) == {"HtoD_pinned", "HtoD_pageable", "DtoH_pinned",
                                     "DtoH_pageable", "DtoD"}
    assert {"float32", "float16", "bfloat16", "float64", "other"} <= set(p.peak_flops)
    assert all(v > 0 for v in p.peak_flops.values())
    # datasheet sanity: host links are slower than device memory, which is slower than math
    assert max(p.copy_bandwidth.values()) < p.memory_bandwidth < p.peak_flops["float32"]


@pytest.mark.parametrize("name, device_name, bandwidth, fp16", [
    ("h100-sxm5-80gb", "NVIDIA H100 80GB HBM3", 3.35e12, 989.5e12),
    ("h200-sxm-141gb", "NVIDIA H200", 4.8e12, 989.5e12),
    ("l4", "NVIDIA L4", 300e9, 121e12),
    ("rtx-4090", "NVIDIA GeForce RTX 4090", 1008e9, 165.2e12),
])
def test_shipped_datasheet_figures(name, device_name, bandwidth, fp16):
    p = load_profile(name)
    assert (p.name, p.memory_bandwidth, p.peak_flops["float16"]) == (device_name, bandwidth,
                                                                    fp16)


def test_unknown_profile_name_lists_the_shipped_ones():
    with pytest.raises(ProfileError, match="shipped: a100-sxm4-80gb, h100-sxm5-80gb"):
        load_profile("v100")


# ----- CLI -----

@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the answer without a GPU")
def test_measure_without_cuda_is_an_error():
    with pytest.raises(calib.CalibrationError, match="calibrate needs a CUDA GPU"):
        calib.measure(quick=True)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the answer without a GPU")
def test_cli_calibrate_without_cuda_one_line_exit_2(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "memcpy_doctor", "calibrate", "--quick",
                           "-o", str(tmp_path / "p.json")],
                          capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert proc.stderr.splitlines() == [
        "memcpy-doctor: error: calibrate needs a CUDA GPU (torch sees none here)"]
    assert not (tmp_path / "p.json").exists()


def test_cli_profile_with_an_unknown_device_profile_lists_names(tmp_path):
    """Through the console script's entry point in this process (tests/test_cli.py runs
    profile's usage errors as a subprocess)."""
    script = tmp_path / "s.py"
    script.write_text("pass\n")
    r = cli_in_process("profile", "--device", "sim", "--device-profile", "v100", script,
                       cwd=tmp_path)
    assert r.status == 2
    assert r.err.splitlines() == [
        "memcpy-doctor: error: no device profile named 'v100'; shipped: a100-sxm4-80gb, "
        "h100-sxm5-80gb, h200-sxm-141gb, l4, rtx-4090"]


# ----- on a real GPU -----

@pytest.mark.cuda
def test_calibrate_on_this_gpu(tmp_path):
    """Quick calibration: a loadable profile with figures a GPU can have, and the CLI writes
    the same kind of file."""
    m = calib.measure(quick=True)
    d = calib.build_profile(m, load_profile(calib.base_profile_name(m["device"]["name"])))
    p = DeviceProfile.from_dict(d)
    assert p.name == torch.cuda.get_device_name() and p.calibrated
    for path in calib.COPY_PATHS:
        assert 1e8 < p.copy_bandwidth[path] < 1e12, (path, p.copy_bandwidth[path])
        assert 0 <= p.copy_setup[path] < 1_000_000
    assert 0 < p.launch_ns < 1_000_000 and 0 < p.sync_ns < 1_000_000
    assert 0 < p.kernel_min_ns < 100_000
    assert 1e11 < p.peak_flops["float32"] < 1e15
    assert 1e10 < p.memory_bandwidth < 1e13
    out = tmp_path / "gpu.json"
    subprocess.run([sys.executable, "-m", "memcpy_doctor", "calibrate", "--quick", "-o",
                    str(out)], check=True, capture_output=True, timeout=600)
    assert load_profile(str(out)).calibrated
