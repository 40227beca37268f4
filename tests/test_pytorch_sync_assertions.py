"""PyTorch's own sync assertions, as tests of the simulated GPU (issue 41): test_torch.py's
`test_sync_warning`, and test_cuda.py's non_blocking tests (at the end).

`test/test_torch.py::TestTorchDeviceType::test_sync_warning` runs each call under
`CudaSyncGuard` and asserts that it warns of a synchronizing call (`expect_sync`) or does not
(`expect_no_sync`); its lists (as in PyTorch's main, which lists the host mask under
`expect_no_sync`) are copied here, call for call, with its inputs. A call that
synchronizes must record a sync copy or a host wait; one that does not, neither. Where our
reading of the CUDA source disagreed (a host mask, `x[mask_cpu]`), the test won
(docs/cuda-semantics.md says so).
"""

from __future__ import annotations

import pytest
import torch

import memcpy_doctor

EXPECT_NO_SYNC = [
    "_ind_put_fn(x, mask, 1.)",
    "_ind_put_fn(x, mask_cpu, y)",
    "_ind_put_fn(x, ind, y)",
    "_ind_get_fn(x, mask_cpu)",
    "_ind_get_fn(x, ind)",
    "torch.nn.functional.one_hot(ind, num_classes=size)",
    "torch.randperm(20000, device=device)",
    "torch.repeat_interleave(x, 2, output_size=2 * size)",
    "torch.repeat_interleave(x, repeats, output_size=2 * size)",
    "torch.any(y)",
]
EXPECT_SYNC = [
    "_ind_put_fn(x, mask, y)",
    "_ind_put_fn(x, ind_cpu, y)",
    "_ind_get_fn(x, mask)",
    "_ind_get_fn(x, ind_cpu)",
    "x.nonzero()",
    "_cond_fn(y)",
    "torch.nn.functional.one_hot(ind)",
    "torch.repeat_interleave(x, repeats)",
]


#: The test's helpers, compiled with the call under one file name: every frame of the call
#: is there, so its copies and waits are told from those of the setup.
HELPERS = """\
def _ind_put_fn(x, ind, val):
    x[ind] = val
    return x

def _ind_get_fn(x, ind):
    return x[ind]

def _cond_fn(x):
    if x:  # taking boolean value of a tensor synchronizes
        return x
    return 2 * x

"""
FILE = "<pytorch test_sync_warning>"


def _syncs(call: str, where: str) -> int:
    """Sync copies and host waits the tracer records for `call` on `where` ("sim", or "cuda"
    for a real GPU), with the inputs of PyTorch's test."""
    torch.manual_seed(0)
    with memcpy_doctor.profiler(device=where) as prof:
        device = "cuda"
        size = 4
        x = torch.rand(size, device=device)
        y = torch.rand((), device=device)
        ind = torch.randint(size, (3,), device=device)
        ind_cpu = ind.cpu()
        repeats = torch.full((1,), 2, device=device)
        mask = torch.randint(2, (size,), device=device, dtype=bool)
        mask_cpu = mask.cpu()
        scope = dict(torch=torch, device=device, size=size, x=x, y=y, ind=ind,
                     ind_cpu=ind_cpu, repeats=repeats, mask=mask, mask_cpu=mask_cpu)
        exec(compile(HELPERS + f"result = {call}\n", FILE, "exec"), scope)
    trace = prof.trace
    return (sum(c.calls for c in trace.copies if c.sync and c.site and c.site.file == FILE)
            + sum(w.calls for w in trace.waits if w.site and w.site.file == FILE))


@pytest.fixture(params=["sim", pytest.param("cuda", marks=pytest.mark.cuda)])
def where(request):
    return request.param


@pytest.mark.parametrize("call", EXPECT_NO_SYNC)
def test_what_pytorch_expects_not_to_sync_does_not(call, where):
    assert _syncs(call, where) == 0


@pytest.mark.parametrize("call", EXPECT_SYNC)
def test_what_pytorch_expects_to_sync_does(call, where):
    assert _syncs(call, where) > 0


# ----- test/test_cuda.py: non_blocking and pinned memory -----

def _sleep_device(where: str) -> None:
    """test_cuda.py pushes a 0.1 s spin to the stream first (`torch.cuda._sleep`), so that a
    copy that does not block finds the stream busy; the simulated GPU's copy of 4 MB keeps
    its modeled stream busy past the host's next call already."""
    if where == "cuda":
        from torch.testing._internal.common_utils import get_cycles_per_ms
        torch.cuda._sleep(int(100 * get_cycles_per_ms()))


@pytest.mark.parametrize("dst, non_blocking", [("cuda", True), ("cuda", False),
                                               ("cpu", True), ("cpu", False)])
def test_to_non_blocking_as_test_cuda_asserts(dst, non_blocking, where):
    """test_cuda.py::test_to_non_blocking: `a.to(device=dst, non_blocking=...)` from the other
    side (pinned when it is the host) leaves the stream busy exactly when non_blocking
    (`stream.query() == not non_blocking`), and its result is pinned exactly when
    non_blocking to the host; so a sync copy is recorded exactly when not non_blocking."""
    with memcpy_doctor.profiler(device=where) as prof:
        stream = torch.cuda.current_stream()
        src = torch.randn(1000000, device="cuda" if dst == "cpu" else "cpu",
                          pin_memory=dst == "cuda")
        torch.cuda.synchronize()
        _sleep_device(where)
        b = src.to(device=dst, non_blocking=non_blocking)  # the copy
        idle = stream.query()
        stream.synchronize()
        pinned = b.is_pinned()
        same = bool(torch.equal(src.cpu(), b.cpu()))
    assert idle == (not non_blocking)
    assert pinned == (non_blocking and dst == "cpu")
    assert same
    line = _line_of("# the copy")
    copies = [c for c in prof.trace.copies if c.site and c.site.line == line]
    assert [(c.direction, c.sync, c.calls) for c in copies] == [
        ("HtoD" if dst == "cuda" else "DtoH", not non_blocking, 1)]


def test_to_cpu_blocking_by_default_as_test_cuda_asserts(where):
    """test_cuda.py::test_to_cpu_blocking_by_default: `.to(device="cpu")` waits for the stream
    and gives pageable memory."""
    with memcpy_doctor.profiler(device=where) as prof:
        src = torch.randn(1000000, device="cuda")
        torch.cuda.synchronize()
        _sleep_device(where)
        dst = src.to(device="cpu")  # blocking by default
        idle = torch.cuda.current_stream().query()
        pinned = dst.is_pinned()
    assert idle and not pinned
    [copy] = [c for c in prof.trace.copies if c.site.line == _line_of("# blocking by default")]
    assert (copy.direction, copy.sync, copy.pinned) == ("DtoH", True, False)


def test_copy_non_blocking_as_test_cuda_asserts(where):
    """test_cuda.py::test_copy_non_blocking: `a.copy_(b, non_blocking=True)` between the device
    and pinned memory, either way, does not wait (the test waits on an event recorded after
    it before it compares): async copies, and the event's synchronize a host wait."""
    with memcpy_doctor.profiler(device=where) as prof:
        for a, b in ((torch.ones(10000000, dtype=torch.uint8).cuda(),
                      torch.zeros(10000000, dtype=torch.uint8).pin_memory()),
                     (torch.zeros(10000000, dtype=torch.uint8).pin_memory(),
                      torch.ones(10000000, dtype=torch.uint8).cuda())):
            event = torch.cuda.Event()
            a.copy_(b, non_blocking=True)  # copy non_blocking
            event.record()
            event.synchronize()
            assert torch.equal(a.cpu(), b.cpu())
    line = _line_of("# copy non_blocking")
    copies = sorted((c.direction, c.sync, c.pinned, c.calls) for c in prof.trace.copies
                    if c.site.line == line)
    assert copies == [("DtoH", False, True, 1), ("HtoD", False, True, 1)]
    assert [(w.kind, w.calls) for w in prof.trace.waits
            if w.site.line == line + 2] == [("event_synchronize", 2)]


def _line_of(tag: str) -> int:
    import pathlib
    text = pathlib.Path(__file__).read_text().splitlines()
    (hit,) = [i for i, s in enumerate(text, 1) if s.rstrip().endswith(tag)]
    return hit
