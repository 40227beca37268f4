"""PyTorch's own sync assertions, as tests of the simulated GPU (issue 41).

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
