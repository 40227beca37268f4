"""The real GPU path (`--device cuda`). Skipped without a GPU; each compares with facts that a
wrong tracer would get wrong."""

from __future__ import annotations

import pathlib
import subprocess
import sys

import pytest
import torch

import memcpy_doctor
from helpers import concurrently

pytestmark = pytest.mark.cuda
ROOT = pathlib.Path(__file__).resolve().parent.parent


def test_measured_device_times_and_waits():
    with memcpy_doctor.profiler(device="cuda") as prof:
        a = torch.randn(2048, 2048, device="cuda")
        for _ in range(5):
            b = a @ a
        torch.cuda.synchronize()
        b[0, 0].item()
    trace = prof.trace
    assert trace.meta.device == "cuda" and not trace.meta.simulated
    mm = [o for o in trace.ops if o.op == "aten::mm"]
    assert sum(o.calls for o in mm) == 5
    assert all(o.device == "cuda:0" and o.device_ns > 0 for o in mm)
    assert [(w.kind, w.calls) for w in trace.waits] == [("synchronize", 1)]
    item = [c for c in trace.copies if c.trigger == "item"]
    assert [(c.direction, c.sync, c.calls, c.bytes) for c in item] == [("DtoH", True, 1, 4)]


def test_async_copy_device_time_is_resolved_later():
    with memcpy_doctor.profiler(device="cuda") as prof:
        h = torch.randn(1 << 20).pin_memory()
        d = h.to("cuda", non_blocking=True)
        d.sum()
    (copy,) = [c for c in prof.trace.copies if c.direction == "HtoD"]
    assert (copy.sync, copy.pinned, copy.bytes) == (False, True, 4 << 20)
    assert copy.device_ns > 0


def test_non_blocking_from_pageable_memory_is_sync_and_says_it_asked():
    """On a real GPU as on the simulated one: `non_blocking=True` from pageable memory is a
    sync copy (the host is blocked while the driver stages it) that says it asked; from
    pinned memory it is async; without non_blocking it asked nothing."""
    h = torch.randn(1 << 20)
    p = h.pin_memory()
    with memcpy_doctor.profiler(device="cuda") as prof:
        a = h.to("cuda", non_blocking=True)
        b = p.to("cuda", non_blocking=True)
        c = h.to("cuda")
        d = torch.empty(1 << 20, device="cuda")
        d.copy_(h, non_blocking=True)
        torch.cuda.synchronize()
    got = sorted((c.sync, c.pinned, c.non_blocking, c.trigger, c.calls, c.bytes)
                 for c in prof.trace.copies if c.direction == "HtoD")
    assert got == [(False, True, True, "to", 1, 4 << 20), (True, False, False, "to", 1, 4 << 20),
                   (True, False, True, "copy_", 1, 4 << 20),
                   (True, False, True, "to", 1, 4 << 20)]
    assert "2 sync CPU->GPU copies asked non_blocking=True from pageable memory" in prof.report()
    assert a.is_cuda and b.is_cuda and c.is_cuda


def test_light_finds_non_blocking_copies_from_pageable_memory():
    """`profile --light` wraps what sync-debug mode does not flag: `.to()`, `.cuda()` and
    `copy_` with non_blocking=True from pageable memory to the device (and not from pinned
    memory), at the same lines as the full tracer."""
    from memcpy_doctor.analysis.compare import sync_sites
    from memcpy_doctor.tracer import Tracer
    from memcpy_doctor.tracer.light import LightTracer

    h = torch.randn(1 << 16)
    p = h.pin_memory()
    d = torch.empty(1 << 16, device="cuda")

    def program():
        h.to("cuda", non_blocking=True)
        h.cuda(non_blocking=True)
        d.copy_(h, non_blocking=True)
        p.to("cuda", non_blocking=True)
        torch.cuda.synchronize()

    with Tracer(device="cuda") as full:
        program()
    with LightTracer(device="cuda") as light:
        program()
    assert sync_sites(light.trace) == sync_sites(full.trace)
    got = sorted((c.direction, c.trigger, c.non_blocking, c.calls)
                 for c in light.trace.copies if c.direction == "HtoD")
    assert got == [("HtoD", "copy_", True, 1), ("HtoD", "cuda", True, 1),
                   ("HtoD", "to", True, 1)]


@pytest.mark.parametrize("sample", ["shape_slice_crop.py", "item_every_step.py",
                                    "clean_pinned.py", "embedding_l2.py"])
def test_sim_and_gpu_agree_on_copies(tmp_path, sample):
    """The simulated GPU reports the same copy paths and counts as the real one. The two runs
    go side by side (on the lent GPU machine this file's time counts against a budget)."""
    def run(device):
        out = tmp_path / f"{device}.json"
        subprocess.run([sys.executable, "-m", "memcpy_doctor", "profile", "--device", device,
                        "-o", str(out), str(ROOT / "sample_models" / sample)],
                       check=True, capture_output=True, cwd=tmp_path, timeout=300)
        return memcpy_doctor.load_trace(out)

    traces = dict(zip(("cuda", "sim"), concurrently(lambda: run("cuda"), lambda: run("sim"))))

    def paths(trace):
        return sorted((c.direction, c.sync, c.trigger, c.site.line, c.calls, c.bytes)
                      for c in trace.copies)

    assert paths(traces["sim"]) == paths(traces["cuda"])
