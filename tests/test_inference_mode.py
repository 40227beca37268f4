"""Inside `torch.inference_mode()` every host read is found as under `torch.no_grad()`: with the
same trigger, direction, bytes and line (issue 41). Autograd's keys are off there, so torch
hands the dispatch mode composite ops (`aten::item`, `aten::is_nonzero`, `aten::argwhere`)
whole; the per-op path decomposes them, so that their parts are recorded as everywhere else.
On the simulated GPU; the path is the same on a real one."""

from __future__ import annotations

import textwrap

import pytest
import torch

from triggers_util import run_case

#: One statement each, `t` a float device tensor of 6 elements, `m` a device bool mask,
#: `i` a device int64 tensor: the sync triggers of docs/cuda-sync-points.md a program reads
#: values with.
READS = [
    "t.sum().item()",
    "float(t.sum())",
    "int(i.sum())",
    "bool(m.any())",
    "1 if t.sum() > 0 else 0",
    "t.tolist()",
    "print(t)",
    "f'{t.sum():.2f}'",
    "torch.nonzero(t)",
    "torch.argwhere(t)",
    "torch.where(m)",
    "t[m]",
    "torch.masked_select(t, m)",
    "t.unique()",
    "torch.equal(t, t)",
    "torch.allclose(t, t)",
    "t.cpu()",
    "t.to('cpu')",
    "torch.repeat_interleave(i)",
    "torch.bincount(i)",
    "range(i[0])",
    "t.sum().numpy() if False else t.max().item()",
    "t.median().item()",
    "t[i[0]]",
]

PROGRAM = textwrap.dedent("""\
    import torch
    t = torch.arange(6.0, device="cuda") - 2
    m = t > 0
    i = torch.tensor([1, 2, 0], device="cuda")
    with torch.{mode}():
        x = {read}
""")


def _reads(tmp_path, mode: str, read: str) -> list[tuple]:
    result, path = run_case(tmp_path, PROGRAM.format(mode=mode, read=read), f"{mode}.py")
    if result.exception is not None:
        raise result.exception
    return sorted((c.site.line, c.direction, c.sync, c.trigger, c.bytes, c.calls)
                  for c in result.trace.copies if c.site.line == 6)


@pytest.mark.parametrize("read", READS)
def test_a_read_in_inference_mode_is_found_as_under_no_grad(tmp_path, read):
    no_grad = _reads(tmp_path, "no_grad", read)
    assert no_grad, f"no read recorded for {read} under no_grad"
    assert _reads(tmp_path, "inference_mode", read) == no_grad


def test_inference_mode_from_threads_and_an_error_inside_leaves_nothing_behind(tmp_path):
    """Each thread's reads are recorded; an exception inside inference mode reaches the
    program unchanged (the fixture fails a test that leaves the tracer active)."""
    result, path = run_case(tmp_path, """\
        import threading
        import torch
        t = torch.ones(4, device="cuda")
        def read():
            with torch.inference_mode():
                t.sum().item()
        threads = [threading.Thread(target=read) for _ in range(3)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        with torch.inference_mode():
            t.sum().item()
            raise ValueError("inside")
    """)
    assert isinstance(result.exception, ValueError) and str(result.exception) == "inside"
    reads = sorted((c.site.line, c.thread is None, c.calls) for c in result.trace.copies
                   if c.trigger == "item")
    assert reads == [(6, False, 1)] * 3 + [(13, True, 1)]  # (a path per thread)
    assert not torch.is_inference_mode_enabled()
