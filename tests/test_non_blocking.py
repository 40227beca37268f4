"""`non_blocking=True` from pageable memory is not async (issue 40), on the CPU: what the real
GPU's path answers for each host->device copy (`tracer/cuda.py` `copy_kind`), and what
`profile --light` records from its wrapped calls there (with fakes of the copy). The
simulated GPU's side is in tests/test_sim.py (and, for light mode, tests/test_light.py), the
real GPU's end to end in tests/test_cuda.py, the trace's field in tests/test_trace.py and the
report's lines in tests/test_render_text.py."""

from __future__ import annotations

import pathlib

import pytest
import torch

from memcpy_doctor.tracer.cuda import copy_kind
from memcpy_doctor.tracer.light import LightHooks


@pytest.mark.parametrize("op", ["_to_copy", "copy_"])
@pytest.mark.parametrize("non_blocking, host_pinned, sync", [
    (False, False, True),  # memcpy_and_sync
    (False, True, True),  # memcpy_and_sync, pinned or not
    (True, False, True),  # cudaMemcpyAsync from pageable memory: the driver stages it, the
                          # host blocked meanwhile
    (True, True, False),  # the one async copy to the device
])
def test_copy_kind_to_the_device(op, non_blocking, host_pinned, sync):
    assert copy_kind(op, False, True, non_blocking, host_pinned) == ("HtoD", host_pinned, sync)


# ----- profile --light on a real GPU: the wrapped calls, with fakes of the copy -----

def _copied(t, *args, **kwargs):
    """A fake Tensor.to / Tensor.cuda to the device: a new tensor (as a copy returns)."""
    return t.clone()


def test_light_records_to_and_cuda_from_pageable_memory_with_non_blocking():
    """Sync-debug mode flags no cudaMemcpyAsync, so light mode wraps `.to()` and `.cuda()`:
    a call with non_blocking=True from pageable memory to the device is a sync copy (timed
    by the wall clock, said to have asked non_blocking); any other call goes straight on."""
    hooks = LightHooks()
    to, cuda = hooks.to_wrapper(_copied, "to"), hooks.to_wrapper(_copied, "cuda")
    h = torch.ones(1000)
    to(h, "cuda", non_blocking=True)  # light-to
    cuda(h, 0, True)  # light-cuda
    for args, kwargs in [(("cuda",), {}), (("cpu",), {"non_blocking": True}),
                         ((torch.float16, True), {}), (("cuda", None, False, True), {})]:
        to(h, *args, **kwargs)  # not to the device, or not non_blocking
    cuda(h)
    to(torch.ones(0), "cuda", non_blocking=True)  # empty: torch copies nothing
    hooks.collector.finish()
    records = hooks.collector.copy_records()
    assert sorted((c.direction, c.sync, c.pinned, c.non_blocking, c.trigger, c.site.line,
                   c.calls, c.bytes, c.host_ns > 0) for c in records) == [
        ("HtoD", True, False, True, "cuda", line("light-cuda"), 1, 4000, True),
        ("HtoD", True, False, True, "to", line("light-to"), 1, 4000, True)]


def test_light_records_copy_to_the_device_from_pageable_memory(monkeypatch):
    """`d.copy_(h, non_blocking=True)` from pageable memory, as light mode's copy_ wrapper
    sees it on a GPU (here `is_cuda` answered for the destination)."""
    hooks = LightHooks()
    copy_ = hooks.copy_wrapper(lambda dst, src, non_blocking=False: dst)
    d, h = torch.empty(1000), torch.ones(1000)
    monkeypatch.setattr(torch.Tensor, "is_cuda", property(lambda t: t is d))
    copy_(d, h, True)  # light-copy
    copy_(d, h)  # blocking: sync-debug mode flags it
    hooks.collector.finish()
    assert [(c.direction, c.sync, c.pinned, c.non_blocking, c.trigger, c.site.line, c.bytes)
            for c in hooks.collector.copy_records()] == [
        ("HtoD", True, False, True, "copy_", line("light-copy"), 4000)]


def line(tag: str) -> int:
    """The line of this file that ends with `# <tag>`."""
    text = pathlib.Path(__file__).read_text().splitlines()
    (hit,) = [i for i, s in enumerate(text, 1) if s.endswith(f"# {tag}")]
    return hit


def test_light_records_the_common_reads_with_their_kind_size_and_time(monkeypatch):
    """On a real GPU light mode wraps `item`, `tolist`, `cpu`, `bool`, `float` and `int`: a
    read of a device tensor is a DtoH sync copy of its bytes, timed, its kind known, and
    the sync-debug warning inside it not counted again (issue 41: every sync was DtoH
    `sync_debug`, 0 bytes, untimed). Here `is_cuda` is answered for one tensor."""
    from memcpy_doctor.tracer.light import READS
    import warnings
    from memcpy_doctor.core.defaults import SYNC_DEBUG_WARNING

    d, h = torch.ones(3), torch.ones(3)
    monkeypatch.setattr(torch.Tensor, "is_cuda", property(lambda t: t is d))

    def synced(value):  # a fake read: the warning c10 raises for a device tensor, the value
        def read(t, *args, **kwargs):
            if t is d:
                warnings.warn(SYNC_DEBUG_WARNING + " (fake)", UserWarning)
            return value
        return read

    with LightHooks() as hooks:
        wrapped = {trigger: hooks.read_wrapper(synced(1.0), trigger) for _, trigger in READS}
        wrapped["item"](d)  # light-item
        wrapped["cpu"](d)  # light-cpu
        wrapped["bool"](d)  # light-bool
        wrapped["item"](h)  # a host tensor: no copy
    hooks.collector.finish()
    assert sorted((c.direction, c.sync, c.trigger, c.site.line, c.bytes, c.host_ns > 0,
                   c.non_blocking) for c in hooks.collector.copy_records()) == sorted([
        ("DtoH", True, "item", line("light-item"), 12, True, False),
        ("DtoH", True, "cpu", line("light-cpu"), 12, True, False),
        ("DtoH", True, "bool", line("light-bool"), 12, True, False)])
