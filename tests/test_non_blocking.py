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


def test_light_records_to_and_cuda_that_cross_and_make_the_host_wait(monkeypatch):
    """On a real GPU light mode wraps `.to()` and `.cuda()`: a call that copies between host
    memory and the device and makes the host wait is a sync copy, timed by the wall clock,
    with its direction, pinned and non_blocking (issue 40: non_blocking from pageable memory,
    which sync-debug mode does not flag; issue 41: the blocking ones, which it flags with no
    direction); the one async kind (non_blocking from pinned memory to the device, or to the
    host) and any call that does not cross are not. Here `is_cuda` and `is_pinned` are
    answered for chosen tensors."""
    d, pinned = torch.ones(250), torch.ones(500)
    monkeypatch.setattr(torch.Tensor, "is_cuda", property(lambda t: t is d))
    monkeypatch.setattr(torch.Tensor, "is_pinned", lambda t: t is pinned)
    hooks = LightHooks()
    to, cuda = hooks.to_wrapper(_copied, "to"), hooks.to_wrapper(_copied, "cuda")
    h = torch.ones(1000)
    to(h, "cuda", non_blocking=True)  # light-to
    cuda(h, 0, True)  # light-cuda
    to(h, torch.device("cuda", 0))  # light-blocking
    to(pinned, "cuda:0", torch.float32, False)  # light-pinned-blocking
    to(d, "cpu")  # light-back
    for t, args, kwargs in [
            (h, ("cpu",), {"non_blocking": True}), (h, (torch.float16, True), {}),
            (pinned, ("cuda",), {"non_blocking": True}), (d, ("cpu", None, True), {}),
            (d, ("cuda",), {}), (h, ("meta",), {})]:
        to(t, *args, **kwargs)  # not across, or async
    cuda(pinned, non_blocking=True)
    cuda(d)
    to(torch.ones(0), "cuda", non_blocking=True)  # empty: torch copies nothing
    hooks.collector.finish()
    records = hooks.collector.copy_records()
    assert sorted((c.direction, c.sync, c.pinned, c.non_blocking, c.trigger, c.site.line,
                   c.calls, c.bytes, c.host_ns > 0) for c in records) == [
        ("DtoH", True, False, False, "to", line("light-back"), 1, 1000, True),
        ("HtoD", True, False, False, "to", line("light-blocking"), 1, 4000, True),
        ("HtoD", True, False, True, "cuda", line("light-cuda"), 1, 4000, True),
        ("HtoD", True, False, True, "to", line("light-to"), 1, 4000, True),
        ("HtoD", True, True, False, "to", line("light-pinned-blocking"), 1, 2000, True)]


def test_light_records_copy_between_host_and_device_unless_async(monkeypatch):
    """`copy_` between host memory and the device, as light mode's wrapper sees it on a GPU:
    blocking either way, or non_blocking with pageable memory, the host waits; non_blocking
    with pinned memory it does not. Here `is_cuda` and `is_pinned` are answered."""
    hooks = LightHooks()
    copy_ = hooks.copy_wrapper(lambda dst, src, non_blocking=False: dst)
    d, h, pinned = torch.empty(1000), torch.ones(1000), torch.ones(10)
    monkeypatch.setattr(torch.Tensor, "is_cuda", property(lambda t: t is d))
    monkeypatch.setattr(torch.Tensor, "is_pinned", lambda t: t is pinned)
    copy_(d, h, True)  # light-copy
    copy_(d, h)  # light-copy-blocking
    copy_(h, d, non_blocking=True)  # light-copy-back
    copy_(d, pinned, True)  # async
    copy_(pinned, d, True)  # async
    copy_(h, pinned)  # host to host
    hooks.collector.finish()
    assert sorted((c.direction, c.sync, c.pinned, c.non_blocking, c.trigger, c.site.line,
                   c.bytes) for c in hooks.collector.copy_records()) == [
        ("DtoH", True, False, True, "copy_", line("light-copy-back"), 4000),
        ("HtoD", True, False, False, "copy_", line("light-copy-blocking"), 4000),
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
    from memcpy_doctor.tracer.lightwraps import READS
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
        wrapped = {trigger: hooks.read_wrapper(synced(1.0), trigger, nbytes)
                   for _, _, trigger, nbytes in READS}
        wrapped["item"](d)  # light-item
        wrapped["cpu"](d)  # light-cpu
        wrapped["bool"](d)  # light-bool
        wrapped["nonzero"](d)  # light-nonzero
        wrapped["item"](h)  # a host tensor: no copy
    hooks.collector.finish()
    assert sorted((c.direction, c.sync, c.trigger, c.site.line, c.bytes, c.host_ns > 0,
                   c.non_blocking) for c in hooks.collector.copy_records()) == sorted([
        ("DtoH", True, "item", line("light-item"), 12, True, False),
        ("DtoH", True, "cpu", line("light-cpu"), 12, True, False),
        ("DtoH", True, "bool", line("light-bool"), 12, True, False),
        ("DtoH", True, "nonzero", line("light-nonzero"), 4, True, False)])  # (the count)
