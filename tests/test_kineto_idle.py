"""The GPU idle time each host sync caused, read from a torch.profiler trace (issue 43;
kineto/idle.py): from the device's last work before the host returned from its wait to the
next work, when the host launched that after the device ran dry."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from helpers import cli_in_process
from memcpy_doctor.kineto.reader import from_kineto, load_any
from test_kineto import _gpu, _x, kineto_trace

SHARED = Path(__file__).resolve().parents[2] / "shared" / "kineto"


def _trace(events: list[dict]) -> dict:
    return {"schemaVersion": 1, "deviceProperties": [{"name": "NVIDIA A100-SXM4-80GB"}],
            "traceEvents": events}


def ahead_trace() -> dict:
    """The host ahead of the device, then waiting for it three times. A kernel runs 5..105;
    an upload (`aten::to`, pageable) launched at 12 runs 105..110 after it, waited for by a
    stream sync until 112; the next kernel, launched at 150, runs 155..255: 45 us of idle
    after the upload. An `item()` launched at 165 copies 255..257, its sync returns at 260;
    the next kernel, launched at 300, starts at 305: 48 us. A device sync called at 330
    while a kernel runs 325..425 returns at 430; the next kernel, launched at 500, starts at
    510: 85 us."""
    return _trace([
        _x("cpu_op", "aten::mm", 0, 10), _x("cuda_runtime", "cudaLaunchKernel", 2, 3,
                                             correlation=1),
        _gpu("kernel", "k1", 5, 100, 1),
        _x("cpu_op", "aten::to", 10, 105),
        _x("cuda_runtime", "cudaMemcpyAsync", 12, 8, correlation=2),
        _gpu("gpu_memcpy", "Memcpy HtoD (Pageable -> Device)", 105, 5, 2, bytes=4096),
        _x("cuda_runtime", "cudaStreamSynchronize", 22, 90, correlation=3),
        _x("cuda_runtime", "cudaLaunchKernel", 150, 3, correlation=4),
        _gpu("kernel", "k2", 155, 100, 4),
        _x("cpu_op", "aten::item", 160, 110), _x("cpu_op", "aten::_local_scalar_dense", 162, 105),
        _x("cuda_runtime", "cudaMemcpyAsync", 165, 5, correlation=5),
        _gpu("gpu_memcpy", "Memcpy DtoH (Device -> Pageable)", 255, 2, 5, bytes=4),
        _x("cuda_runtime", "cudaStreamSynchronize", 172, 88, correlation=6),
        _x("cuda_runtime", "cudaLaunchKernel", 300, 3, correlation=7),
        _gpu("kernel", "k3", 305, 10, 7),
        _x("cuda_runtime", "cudaLaunchKernel", 320, 3, correlation=8),
        _gpu("kernel", "k4", 325, 100, 8),
        _x("cuda_runtime", "cudaDeviceSynchronize", 330, 100, correlation=9),
        _x("cuda_runtime", "cudaLaunchKernel", 500, 3, correlation=10),
        _gpu("kernel", "k5", 510, 10, 10)])


def test_each_sync_gets_the_idle_stretch_after_it():
    t = from_kineto(ahead_trace(), "k.json")
    assert sorted((c.trigger, c.sync, c.idle_ns) for c in t.copies) == [
        ("item", True, 48_000), ("to", True, 45_000)]
    assert [(w.kind, w.idle_ns) for w in t.waits] == [("synchronize", 85_000)]


def test_a_sync_on_a_device_already_dry_caused_none():
    """kineto_trace: each copy and the device sync is made when the device has nothing to
    run (the host behind it): the idle after them is the host's doing, not the syncs'."""
    t = from_kineto(kineto_trace(), "k.json")
    assert sorted((c.trigger, c.idle_ns) for c in t.copies if c.sync) == [
        ("item", 0), ("to", 0)]
    assert [(w.kind, w.idle_ns) for w in t.waits] == [("synchronize", 0)]


def test_a_stretch_counts_once_for_the_first_sync_inside_it():
    """Two device syncs back to back: the first drained the queue and gets the stretch; the
    second found nothing to wait for."""
    events = [_x("cpu_op", "aten::mm", 0, 10),
              _x("cuda_runtime", "cudaLaunchKernel", 2, 3, correlation=1),
              _gpu("kernel", "gemm", 5, 95, 1),
              _x("cuda_runtime", "cudaDeviceSynchronize", 10, 100, correlation=2),   # -> 110
              _x("cuda_runtime", "cudaStreamSynchronize", 120, 5, correlation=3),   # -> 125
              _x("cpu_op", "aten::mm", 200, 10),
              _x("cuda_runtime", "cudaLaunchKernel", 202, 3, correlation=4),
              _gpu("kernel", "gemm", 210, 10, 4)]
    t = from_kineto(_trace(events), "k.json")
    assert sorted((w.kind, w.calls, w.idle_ns) for w in t.waits) == [
        ("stream_synchronize", 1, 0), ("synchronize", 1, 110_000)]   # 100 -> 210


def test_a_pageable_upload_whose_transfer_runs_after_the_call_drained_nothing():
    """cudaMemcpyAsync from pageable memory returns once the data is staged; the transfer
    itself starts later. The device was dry before the call: the idle before the transfer
    is not the upload's (sampled_rank0's 16 uploads had been charged 704 ms of it)."""
    events = [_x("cuda_runtime", "cudaLaunchKernel", 0, 2, correlation=1),
              _gpu("kernel", "k", 5, 10, 1),                                # dry from 15
              _x("cpu_op", "aten::to", 100, 30),
              _x("cuda_runtime", "cudaMemcpyAsync", 105, 20, correlation=2),  # -> 125
              _gpu("gpu_memcpy", "Memcpy HtoD (Pageable -> Device)", 130, 3, 2, bytes=64),
              _x("cuda_runtime", "cudaLaunchKernel", 200, 2, correlation=3),
              _gpu("kernel", "k2", 210, 10, 3)]
    [copy] = from_kineto(_trace(events), "k.json").copies
    assert (copy.sync, copy.idle_ns) == (True, 0)


def test_no_idle_while_other_work_runs_or_when_the_next_was_queued_before():
    """A device sync while a kernel on another stream still runs: the device was busy. A
    sync after which the next kernel had been launched before the device ran dry (by
    another thread): the host did not hold it up."""
    busy = [_x("cuda_runtime", "cudaLaunchKernel", 0, 2, correlation=1),
            _gpu("kernel", "long", 5, 500, 1) | {"tid": 9},
            _x("cuda_runtime", "cudaLaunchKernel", 3, 2, correlation=2),
            _gpu("kernel", "short", 6, 10, 2),
            _x("cuda_runtime", "cudaStreamSynchronize", 20, 10, correlation=3),
            _x("cuda_runtime", "cudaLaunchKernel", 40, 2, correlation=4),
            _gpu("kernel", "next", 600, 10, 4)]
    # (a stream sync is a wait for every stream here: its stream is not recorded)
    assert [w.idle_ns for w in from_kineto(_trace(busy), "k.json").waits] == [0]
    queued = [_x("cuda_runtime", "cudaLaunchKernel", 0, 2, correlation=1),
              _gpu("kernel", "k", 5, 10, 1),
              _x("cuda_runtime", "cudaLaunchKernel", 8, 2, tid=2, correlation=2),
              _x("cuda_runtime", "cudaDeviceSynchronize", 10, 10, correlation=3),
              _gpu("kernel", "k2", 50, 10, 2)]   # launched at 8, before the device ran dry at 15
    assert [w.idle_ns for w in from_kineto(_trace(queued), "k.json").waits] == [0]


def test_the_report_ranks_sync_copies_by_the_idle_they_caused(tmp_path):
    (tmp_path / "k.json").write_text(json.dumps(ahead_trace()))
    r = cli_in_process("report", "k.json", cwd=tmp_path)
    assert r.status == 0, r.err
    lines = r.out.splitlines()
    at = lines.index("-------------------------         Sync copies         "
                     "-------------------------")
    assert lines[at + 2].split()[4:7] == ["Total", "GPU", "idle"]
    assert [line.split()[:2] + line.split()[6:7] for line in lines[at + 3:at + 5]] == [
        ["DtoH", "item", "0.048"], ["HtoD", "to", "0.045"]]   # (the upload took longer)
    assert "GPU idle after the other waits: synchronize 0.085 (1 call)" in lines


@pytest.mark.skipif(not SHARED.is_dir(), reason="../shared/kineto is not here")
def test_the_alexnet_syncs_idle_stretches():
    """a100_alexnet's 16 uploads and 5 device syncs were each made when the device had run
    dry (its last work had ended 45 us to 8.9 ms before each call): the host was behind, and
    the idle after them is not theirs (HTA counts those stretches as host wait)."""
    t = load_any(str(SHARED / "a100_alexnet.json.gz"))
    assert [(c.calls, c.idle_ns) for c in t.copies] == [(16, 0)]
    assert [(w.kind, w.calls, w.idle_ns) for w in t.waits] == [("synchronize", 5, 0)]


def test_explain_gives_each_copys_bandwidth_and_the_idle_after_it(tmp_path):
    (tmp_path / "k.json").write_text(json.dumps(ahead_trace()))
    r = cli_in_process("explain", "k.json", cwd=tmp_path)
    assert r.status == 0, r.err
    assert ("    2 copies (DtoH `item`, HtoD `to`), 0.198 ms, GPU idle 0.093 ms after, at ?"
            in r.out.splitlines())
    r = cli_in_process("explain", "--format", "json", "k.json", cwd=tmp_path)
    copies = [c for ch in json.loads(r.out)["chains"] for c in ch["copies"]]
    assert [(c["direction"], c["pinned"], c["device_ns"], c["bandwidth_bps"],
             c["profile_bandwidth_bps"], c["idle_ns"]) for c in copies] == [
        ("DtoH", False, 2_000, 2_000_000.0, 10e9, 48_000),   # ranked by the idle after
        ("HtoD", False, 5_000, 819_200_000.0, 12e9, 45_000)]


def test_a_single_path_line_says_pinned_or_pageable_and_the_share_of_the_profile(tmp_path):
    data = kineto_trace()
    data["traceEvents"] = [e for e in data["traceEvents"] if e.get("ts", 0) < 100]  # the upload
    (tmp_path / "k.json").write_text(json.dumps(data))
    r = cli_in_process("explain", "k.json", cwd=tmp_path)
    assert ("    1 copy (HtoD `to`), 0.023 ms, pageable, 0.819 GB/s of the profile's 12 (6.8%), "
            "GPU idle 0 ms after, at ?") in r.out.splitlines()
