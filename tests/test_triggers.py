"""The rows of docs/cuda-semantics.md on the simulated GPU: each copy at the right
line, with the right direction, sync flag and trigger, and nothing else reported."""

from __future__ import annotations

import pytest

from triggers_util import check


@pytest.fixture(params=["sim", pytest.param("cuda", marks=pytest.mark.cuda)])
def device(request):
    """Each case runs on the simulated GPU, and on the real one where there is one."""
    return request.param


def test_explicit_host_to_device(tmp_path, device):
    check(tmp_path, """
        import torch
        h = torch.arange(6.0)
        a = h.to("cuda")  # expect: HtoD sync to pageable
        b = h.cuda()  # expect: HtoD sync cuda
        c = h.to(device=0)  # expect: HtoD sync to
        m = torch.nn.Linear(4, 2).to("cuda")  # expect: HtoD sync to; HtoD sync to
        d = torch.empty(6, device="cuda")
        d.copy_(h)  # expect: HtoD sync copy_
        e = a.to("cuda")
        f = a.to(torch.float64)
        g = h.to(a)  # expect: HtoD sync to
    """, device)


def test_non_blocking_pinned_and_pageable(tmp_path, device):
    check(tmp_path, """
        import torch
        h = torch.ones(1000)
        p = h.pin_memory()
        a = p.to("cuda", non_blocking=True)  # expect: HtoD async to pinned
        b = h.to("cuda", non_blocking=True)  # expect: HtoD sync to pageable
        q = torch.empty(10, pin_memory=True)
        c = q.cuda(non_blocking=True)  # expect: HtoD async cuda pinned
        assert p.is_pinned() and q.is_pinned() and not h.is_pinned()
    """, device)


def test_factories_with_data(tmp_path, device):
    check(tmp_path, """
        import torch
        a = torch.tensor([1.0, 2.0], device="cuda")  # expect: HtoD sync factory
        b = torch.as_tensor([1, 2, 3], device="cuda")  # expect: HtoD sync factory
        c = a.new_tensor([5.0])  # expect: HtoD sync factory
        d = torch.as_tensor(a, device="cuda")
        e = torch.zeros(3, device="cuda")
        f = torch.randn(2, 2, device="cuda")
        g = torch.arange(10, device="cuda")
        h = torch.full((2,), 3.0, device="cuda")
        i = torch.tensor([], device="cuda")
    """, device)


def test_device_to_host(tmp_path, device):
    check(tmp_path, """
        import torch
        t = torch.arange(6.0, device="cuda")
        a = t.cpu()  # expect: DtoH sync cpu pageable
        b = t.to("cpu")  # expect: DtoH sync to
        h = torch.empty(6)
        h.copy_(t)  # expect: DtoH sync copy_
        c = t.to("cpu", non_blocking=True)  # expect: DtoH async to pinned
    """, device)


def test_scalar_reads(tmp_path, device):
    check(tmp_path, """
        import torch
        t = torch.arange(6.0, device="cuda")
        a = t.sum().item()  # expect: DtoH sync item
        b = float(t[0])  # expect: DtoH sync float
        c = int(t[1])  # expect: DtoH sync int
        d = bool(t[1] > 0)  # expect: DtoH sync bool
        if t[2] > 0:  # expect: DtoH sync bool
            pass
        n = 0
        while t[n] < 2:  # expect: DtoH sync bool; DtoH sync bool; DtoH sync bool
            n += 1
        r = list(range(t[3].long()))  # expect: DtoH sync __index__
        e = torch.is_nonzero(t[1:2])  # expect: DtoH sync bool
        f = f"{t.sum():.2f}"  # expect: DtoH sync format
    """, device)


def test_reads_of_whole_tensors(tmp_path, device):
    check(tmp_path, """
        import torch
        t = torch.arange(6.0, device="cuda")
        a = t.tolist()  # expect: DtoH sync tolist
        print(t)  # expect: DtoH sync print
        b = repr(t)  # expect: DtoH sync print
        c = str(t)  # expect: DtoH sync print
        d = f"{t}"  # expect: DtoH sync print
        try:
            t.numpy()
        except TypeError as e:
            assert "Use Tensor.cpu()" in str(e)
        else:
            raise AssertionError("numpy() of a cuda tensor must raise")
    """, device)


def test_comparisons_to_python_bool(tmp_path, device):
    check(tmp_path, """
        import torch
        t = torch.arange(6.0, device="cuda")
        a = torch.equal(t, t)  # expect: DtoH sync equal
        b = torch.allclose(t, t)  # expect: DtoH sync allclose
    """, device)


def test_data_dependent_shapes(tmp_path, device):
    check(tmp_path, """
        import torch
        t = torch.arange(6.0, device="cuda")
        a = torch.nonzero(t)  # expect: DtoH sync nonzero
        b = t.nonzero()  # expect: DtoH sync nonzero
        c = torch.argwhere(t)  # expect: DtoH sync nonzero
        d = torch.where(t > 1)  # expect: DtoH sync nonzero
        e = t[t > 2]  # expect: DtoH sync mask
        t[t > 4] = 0.0
        t[t > 4] = t[0]  # expect: DtoH sync mask
        f = torch.masked_select(t, t > 2)  # expect: DtoH sync mask
        g = torch.unique(t)  # expect: DtoH sync unique
        h = torch.unique_consecutive(t)  # expect: DtoH sync unique
        i = torch.where(t > 1, t, 0.0)
        j = torch.nonzero_static(t, size=6)
    """, device)


def test_counts_and_repeats(tmp_path, device):
    check(tmp_path, """
        import torch
        x = torch.arange(3, device="cuda")
        r = torch.ones(3, dtype=torch.long, device="cuda")
        a = torch.bincount(x)  # expect: DtoH sync bincount; DtoH sync bincount
        b = torch.repeat_interleave(x, r)  # expect: DtoH sync repeat_interleave
        c = torch.repeat_interleave(x, r, output_size=3)
        d = torch.repeat_interleave(x, 2)
    """, device)


def test_host_index_tensor(tmp_path, device):
    check(tmp_path, """
        import torch
        t = torch.arange(6.0, device="cuda")
        idx = torch.tensor([0, 2])
        a = t[idx]  # expect: HtoD sync index
        b = t[torch.tensor(1)]
        t[idx] = 1.0  # expect: HtoD sync index; HtoD sync index
        c = t[torch.tensor([0, 1], device="cuda")]  # expect: HtoD sync factory
        d = t[1:3]
    """, device)


def test_a_host_mask_sends_its_positions_without_a_sync(tmp_path, device):
    """torch 2.13's IndexingUtils.h finds a host mask's positions on the host, into pinned
    memory, and sends them with non_blocking: PyTorch's test_torch.py::test_sync_warning
    lists `x[mask_cpu]` and `x[mask_cpu] = y` under expect_no_sync (issue 41)."""
    check(tmp_path, """
        import torch
        x = torch.rand(4, device="cuda")
        y = torch.rand((), device="cuda")
        mask_cpu = torch.tensor([True, False, True, True])
        a = x[mask_cpu]  # expect: HtoD async index pinned
        x[mask_cpu] = y  # expect: HtoD async index pinned
    """, device)


def test_no_copy_cases(tmp_path, device):
    check(tmp_path, """
        import torch
        t = torch.arange(6.0, device="cuda")
        a = t * torch.tensor(2.0)
        b = t.max()
        c = t.sum()
        d = t.any()
        e = torch.zeros(3, device="cuda") + 1
        f = t.shape[0] + t.numel() + t.dim()
    """, device)


def test_mixing_devices_raises_as_on_a_gpu(tmp_path, device):
    trace = check(tmp_path, """
        import torch
        t = torch.arange(6.0, device="cuda")
        h = torch.ones(6)
        try:
            t + h
        except RuntimeError as e:
            msg = str(e)
        assert msg == ("Expected all tensors to be on the same device, but found at least two "
                       "devices, cuda:0 and cpu!"), msg
        try:
            torch.mm(h.view(2, 3), t.view(3, 2))
        except RuntimeError as e:
            assert "Expected all tensors to be on the same device" in str(e)
        else:
            raise AssertionError("mm over two devices must raise")
    """, device)
    assert trace.copies == []


def test_host_waits(tmp_path, device):
    check(tmp_path, """
        import torch
        t = torch.ones(4, device="cuda") * 2
        torch.cuda.synchronize()  # wait: synchronize
        s = torch.cuda.Stream()
        s.synchronize()  # wait: stream_synchronize
        torch.cuda.current_stream().synchronize()  # wait: stream_synchronize
        e = torch.cuda.Event(enable_timing=True)
        e.record()
        e.synchronize()  # wait: event_synchronize
    """, device)


def test_linalg_error_checks(tmp_path, device):
    check(tmp_path, """
        import torch
        m = torch.eye(3, device="cuda") * 2
        a = torch.linalg.inv(m)  # expect: DtoH sync linalg_check
        b, info = torch.linalg.inv_ex(m)
    """, device)


def test_backward_of_a_transfer_copies_back(tmp_path, device):
    trace = check(tmp_path, """
        import torch
        w = torch.ones(3, requires_grad=True)
        x = w.to("cuda")  # expect: HtoD sync to
        loss = (x * 2).sum()
        loss.backward()  # expect: DtoH sync backward
        assert w.grad.device.type == "cpu", w.grad.device
        assert w.grad.tolist() == [2.0, 2.0, 2.0]
    """, device)
    assert trace is not None


@pytest.mark.parametrize("line", [
    't.to("cuda:1")',
    'torch.zeros(2, device="cuda:1")',
])
def test_second_device_does_not_exist(tmp_path, device, line):
    check(tmp_path, f"""
        import torch
        t = torch.ones(2)
        try:
            {line}
        except RuntimeError as e:
            assert "invalid device ordinal" in str(e)
        else:
            raise AssertionError("the simulated GPU has one device")
    """, device)


def test_default_device_and_type_as(tmp_path, device):
    check(tmp_path, """
        import torch
        x = torch.ones(4, device="cuda")
        y = torch.zeros(4).type_as(x)  # expect: HtoD sync to
        assert y.is_cuda
        with torch.device("cuda"):
            z = torch.randn(3)
        assert z.is_cuda
        torch.set_default_device("cuda")
        try:
            w = torch.ones(2)
            v = torch.tensor([1.0, 2.0])  # expect: HtoD sync factory
        finally:
            torch.set_default_device(None)
        assert w.is_cuda and v.is_cuda
    """, device)


def test_grad_scaler_step_reads_found_inf(tmp_path, device):
    check(tmp_path, """
        import torch
        torch.manual_seed(0)
        model = torch.nn.Linear(4, 2).cuda()  # expect: HtoD sync cuda; HtoD sync cuda
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        scaler = torch.amp.GradScaler("cuda")
        out = model(torch.randn(8, 4, device="cuda")).sum()
        scaler.scale(out).backward()
        scaler.step(opt)  # expect: DtoH sync item
        scaler.update()
    """, device)
