"""Each copy path's bandwidth beside the device profile's figure for it (issue 43, item 11)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from helpers import cli_in_process
from memcpy_doctor.analysis.bandwidth import path_rates, reference, shipped_profile_for
from memcpy_doctor.core.costmodel import load_profile
from memcpy_doctor.core.trace import CopyRecord
from memcpy_doctor.kineto.reader import from_kineto
from test_kineto import kineto_trace
from test_render_text import make_trace

SHARED = Path(__file__).resolve().parents[2] / "shared" / "kineto"


def _copy(direction, pinned, calls, nbytes, device_ns, sync=True):
    return CopyRecord(direction, sync, pinned, "to", calls, nbytes, 1_000, device_ns, None, [],
                      None, None)


@pytest.mark.parametrize("device, shipped", [
    ("NVIDIA A100-SXM4-80GB", "a100-sxm4-80gb"),        # by its name
    ("NVIDIA A100-PG509-200", "a100-sxm4-80gb"),        # by its model
    ("NVIDIA H100 80GB HBM3", "h100-sxm5-80gb"),
    ("NVIDIA H100 PCIe", "h100-sxm5-80gb"),
    ("NVIDIA GeForce RTX 4090", "rtx-4090"),
    ("NVIDIA L40S", None),                              # not the L4
    ("Tesla V100-SXM2-16GB", None),
    ("a GPU (not recorded)", None),
])
def test_the_shipped_profile_of_a_gpu(device, shipped):
    assert shipped_profile_for(device) == shipped


def test_paths_sum_their_copies_and_set_the_profile_figure_beside_them():
    trace = make_trace(copies=[
        _copy("HtoD", False, 2, 2_000_000_000, 1_000_000_000),   # 2 GB/s, pageable
        _copy("HtoD", False, 2, 2_000_000_000, 1_000_000_000),
        _copy("HtoD", True, 1, 24_000_000_000, 2_000_000_000, sync=False),  # 12 GB/s
        _copy("DtoD", None, 1, 1_000_000, 0)])                   # untimed
    ref = reference(trace)
    assert (ref.name, ref.modeled) == ("a100-sxm4-80gb", False)
    assert [(p.name, p.calls, p.sync_calls, p.bytes, p.device_ns, p.bps, p.reference_bps)
            for p in path_rates(trace, ref)] == [
        ("HtoD pageable", 4, 4, 4_000_000_000, 2_000_000_000, 2e9, 12e9),
        ("HtoD pinned", 1, 0, 24_000_000_000, 2_000_000_000, 12e9, 24e9),
        ("DtoD", 1, 1, 1_000_000, 0, None, None)]


def test_a_simulated_trace_is_set_beside_the_profile_it_was_modeled_with():
    trace = make_trace(copies=[_copy("DtoH", True, 1, 5_000, 1_000)])
    profile = load_profile("h100-sxm5-80gb")
    trace.meta.device_profile = profile.to_dict()
    ref = reference(trace)
    assert (ref.name, ref.modeled) == ("NVIDIA H100 80GB HBM3", True)
    assert path_rates(trace, ref)[0].reference_bps == 50e9


def test_an_imported_trace_reports_its_paths_against_the_shipped_profile(tmp_path):
    (tmp_path / "k.json").write_text(json.dumps(kineto_trace()))
    r = cli_in_process("report", "k.json", cwd=tmp_path)
    assert r.status == 0, r.err
    lines = r.out.splitlines()
    at = lines.index("  Copy path      Calls    Sync    Bytes    Device time    GB/s    "
                     "Profile GB/s")
    assert lines[at + 1:at + 5] == [
        "  HtoD pageable  1        1       4.0 KiB  0.005          0.819   12 (6.8%)",
        "  HtoD pinned    1        0       1.0 KiB  0.003          0.341   24 (1.4%)",
        "  DtoH pageable  1        1       4 B      0.002          0.002   10 (0.02%)",
        "  (GB/s: bytes over the copies' device time; profile: a100-sxm4-80gb, shipped for "
        "NVIDIA A100-SXM4-80GB)"]


@pytest.mark.skipif(not SHARED.is_dir(), reason="../shared/kineto is not here")
def test_the_alexnet_uploads_reach_a_third_of_the_pageable_figure():
    """16 pageable uploads, 244,403,360 bytes in 55.503 ms of device time: 4.40 GB/s, as
    bytes over the raw gpu_memcpy events' durations give it."""
    data = json.loads(gzip.decompress((SHARED / "a100_alexnet.json.gz").read_bytes()))
    trace = from_kineto(data, "a100_alexnet.json.gz")
    [path] = path_rates(trace, reference(trace))
    assert (path.name, path.calls, path.bytes, path.device_ns) == (
        "HtoD pageable", 16, 244_403_360, 55_503_000)
    assert round(path.bps / 1e9, 3) == 4.403 and path.reference_bps == 12e9
