"""The simulated GPU behaves as a one-GPU machine and never changes what a program computes."""

from __future__ import annotations

import gc
import warnings
import weakref

import pytest
import torch

import memcpy_doctor
from memcpy_doctor.tracer import Tracer


def train(device: str, steps: int = 3) -> tuple[list[float], torch.Tensor]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(),
                                torch.nn.Linear(16, 2)).to(device)
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    losses = []
    for _ in range(steps):
        x = torch.randn(4, 8).to(device)
        y = torch.randint(0, 2, (4,)).to(device)
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses, model[0].weight.detach().cpu()


def test_cuda_queries_answer_as_one_gpu():
    with memcpy_doctor.profiler(device="sim") as prof:
        assert torch.cuda.is_available()
        assert torch.cuda.device_count() == 1
        assert torch.cuda.current_device() == 0
        assert torch.cuda.get_device_name() == "NVIDIA A100-SXM4-80GB"
        props = torch.cuda.get_device_properties(0)
        assert props.total_memory == 85899345920 and (props.major, props.minor) == (8, 0)
        assert torch.accelerator.current_accelerator() == torch.device("cuda")
        assert torch.cuda.memory_allocated() == 0
        t = torch.zeros(1000, device="cuda")
        assert torch.cuda.memory_allocated() == 4000
        u = torch.ones(250, device="cuda")
        assert torch.cuda.max_memory_allocated() == 5000
        del t
        gc.collect()
        assert torch.cuda.memory_allocated() == 1000
        assert torch.cuda.max_memory_allocated() == 5000
        free, total = torch.cuda.mem_get_info()
        assert (free, total) == (85899345920 - 1000, 85899345920)
        with torch.cuda.device(0), torch.cuda.stream(torch.cuda.Stream()):
            v = u * 2
        assert v.is_cuda
    assert prof.trace.summary.peak_device_memory_bytes == 5000
    assert not torch.cuda.is_available()  # restored on exit


def test_rng_state_memory_summary_and_checkpointing():
    """What training code asks of torch.cuda beyond the device queries: the RNG state (the
    host generator's, which draws the device's numbers), memory_stats / memory_summary from
    the simulated allocations, activation checkpointing, the deprecated torch.cuda.amp API,
    Module.to(device=...), a generator made for cuda."""
    from torch.utils.checkpoint import checkpoint
    with memcpy_doctor.profiler(device="sim"):
        lin = torch.nn.Linear(8, 8).to(device="cuda")
        assert lin.weight.is_cuda
        state = torch.cuda.get_rng_state()
        first = torch.randn(3, device="cuda").tolist()
        torch.cuda.set_rng_state(state)
        assert torch.randn(3, device="cuda").tolist() == first
        x = torch.randn(4, 8, device="cuda", requires_grad=True)
        checkpoint(lambda a: torch.nn.functional.dropout(lin(a), 0.5), x,
                   use_reentrant=False).sum().backward()
        assert x.grad.is_cuda
        stats = torch.cuda.memory_stats()
        assert stats["allocated_bytes.all.current"] == torch.cuda.memory_allocated() > 0
        assert stats["allocated_bytes.all.peak"] == torch.cuda.max_memory_allocated()
        assert "PyTorch CUDA memory summary" in torch.cuda.memory_summary()
        with pytest.warns(FutureWarning), torch.cuda.amp.autocast():  # (deprecated API)
            assert lin(x).dtype == torch.float16
        g = torch.Generator(device="cuda").manual_seed(3)
        a = torch.randn(3, device="cuda", generator=g)
        assert g.device == torch.device("cuda", 0) and a.is_cuda
        assert torch.equal(a, torch.randn(3, device="cuda", generator=g.manual_seed(3)))
        assert isinstance(torch.default_generator, torch.Generator)
    assert torch.Generator is torch._C.Generator


def test_calls_a_cpu_build_lacks_run_as_on_one_gpu():
    """DataParallel over the one device, NVTX ranges, a memory fraction, record_stream: what
    a CPU build of torch cannot do, and a GPU run does."""
    with memcpy_doctor.profiler(device="sim") as prof:
        model = torch.nn.DataParallel(torch.nn.Linear(4, 2).cuda())
        out = model(torch.randn(3, 4))  # a host input: DataParallel's scatter copies it over
        out.sum().backward()
        assert out.is_cuda and model.module.weight.grad.is_cuda
        with torch.cuda.nvtx.range("step"):
            torch.cuda.nvtx.range_push("inner")
            torch.cuda.nvtx.range_pop()
        torch.cuda.set_per_process_memory_fraction(0.5)
        with pytest.raises(ValueError):
            torch.cuda.set_per_process_memory_fraction(2.0)
        s = torch.cuda.Stream()
        with torch.cuda.stream(s):
            x = torch.ones(3, device="cuda")
        x.record_stream(s)
        assert s.device == torch.device("cuda", 0)
    scatter = [c for c in prof.trace.copies if c.direction == "HtoD" and c.bytes == 48]
    assert len(scatter) == 1 and scatter[0].sync


def test_tensors_report_cuda_devices():
    with memcpy_doctor.profiler(device="sim"):
        h = torch.ones(3)
        t = h.cuda()
        v = t[1:]
        s = t.sum()
        assert (t.device, t.is_cuda, t.is_cpu, t.get_device()) == (torch.device("cuda", 0),
                                                                   True, False, 0)
        assert v.device.type == "cuda" and s.device.type == "cuda"
        assert (h.device, h.is_cuda, h.get_device()) == (torch.device("cpu"), False, -1)
        assert t.type() == "torch.cuda.FloatTensor" and h.type() == "torch.FloatTensor"
        assert t.cpu().device.type == "cpu"
        assert repr(t) == "tensor([1., 1., 1.], device='cuda:0')"
        model = torch.nn.Linear(2, 2).cuda()
        assert all(p.is_cuda for p in model.parameters())
        assert next(model.parameters()).device == torch.device("cuda:0")
        out = model(torch.ones(1, 2, device="cuda"))
        assert out.is_cuda and out.grad_fn is not None


def test_training_matches_a_cpu_run_bit_for_bit():
    expected_losses, expected_weight = train("cpu")
    with memcpy_doctor.profiler(device="sim") as prof:
        losses, weight = train("cuda")
    assert losses == expected_losses
    assert torch.equal(weight, expected_weight)
    # the loop really ran on the simulated device: per-step copies and reads were recorded
    reads = [c for c in prof.trace.copies if c.trigger == "item"]
    assert sum(c.calls for c in reads) == 3
    grads_on_device = [o for o in prof.trace.ops if o.op == "aten::mm" and o.device == "cuda:0"]
    assert grads_on_device


def test_tracer_keeps_no_user_tensor_alive():
    refs = []
    with memcpy_doctor.profiler(device="sim"):
        for _ in range(3):
            t = torch.randn(100).cuda()
            u = (t * 2).cpu()
            refs += [weakref.ref(t), weakref.ref(u)]
            del t, u
        gc.collect()
        assert all(r() is None for r in refs)


def test_trace_size_does_not_grow_with_iterations():
    # the timeline keeps the run's first 20 events, a bound both runs reach
    def run(iters: int) -> memcpy_doctor.Trace:
        with memcpy_doctor.profiler(device="sim", timeline_events=20) as prof:
            x = torch.ones(8, device="cuda")
            for _ in range(iters):
                (x * 2).sum().item()
                torch.ones(8).cuda()
        return prof.trace

    short, long = run(5), run(50)
    assert len(short.copies) == len(long.copies) and len(short.ops) == len(long.ops)
    assert {c.trigger: c.calls for c in long.copies} == {"item": 50, "cuda": 50}
    assert abs(len(long.to_json()) - len(short.to_json())) < 0.1 * len(short.to_json())


def test_modes_and_patches_are_undone_on_error():
    with pytest.raises(ZeroDivisionError):
        with memcpy_doctor.profiler(device="sim"):
            torch.ones(2, device="cuda")
            1 / 0
    assert not torch.cuda.is_available()
    assert torch._C._len_torch_function_stack() == 0


def test_one_tracer_at_a_time():
    with memcpy_doctor.profiler(device="sim"):
        with pytest.raises(RuntimeError, match="already running"):
            Tracer(device="sim").start()


def test_profiler_arguments_are_checked(tmp_path):
    with pytest.raises(ValueError, match="state"):
        with memcpy_doctor.profiler(state="TPU"):
            pass
    with pytest.raises(ValueError, match="sorted_key"):
        with memcpy_doctor.profiler(sorted_key="name"):
            pass
    path = tmp_path / "t.json"
    with memcpy_doctor.profiler(device="sim", profile_path=str(path)) as prof:
        torch.ones(2, device="cuda").sum().item()
    assert memcpy_doctor.load_trace(path) == prof.trace
    assert "GpuMemcpySync" in prof.report()


def test_modeled_times_follow_the_profile():
    """A sync read after a long kernel waits for it: the host time of the copy is the
    kernel's remaining device time plus the copy and the sync latency."""
    with memcpy_doctor.profiler(device="sim") as prof:
        a = torch.ones(512, 512, device="cuda")
        b = a @ a
        b[0, 0].item()
    trace = prof.trace
    profile = trace.meta.device_profile
    mm = next(o for o in trace.ops if o.op == "aten::mm")
    flops = 2 * 512 ** 3
    nbytes = 3 * 512 * 512 * 4
    expect_mm = profile["kernel_min_ns"] + round(max(flops / profile["peak_flops"]["float32"],
                                                   nbytes / profile["memory_bandwidth"]) * 1e9)
    assert mm.device_ns == expect_mm and mm.host_ns == profile["launch_ns"]
    read = next(c for c in trace.copies if c.trigger == "item")
    assert read.device_ns == profile["copy_setup_ns"] + round(4 / 10e9 * 1e9)
    # the host waited at least for the matmul to finish
    assert read.host_ns >= expect_mm - profile["launch_ns"] - 10 * profile["launch_ns"]
    assert trace.meta.simulated and trace.meta.device == "sim"


def test_calls_waiting_to_be_folded_reach_exact_counters():
    """Simulated kernels' device times and a device view's host times wait in lists and are
    folded every OpAgg.FOLD_AT calls and at the end: across the folds, the op records and the
    Event Summary rows are exact (kernel: each call costs the host the launch; min and max
    are launch plus the shortest and longest kernel)."""
    from memcpy_doctor.tracer.collector import OpAgg

    n_small, n_big = OpAgg.FOLD_AT + 6, 2 * OpAgg.FOLD_AT + 3
    with memcpy_doctor.profiler(device="sim") as prof:
        small = torch.ones(1000, device="cuda")
        big = torch.ones(100_000, device="cuda")
        for t in [small] * n_small + [big] * n_big:
            t + t  # reads twice, writes once: 3 * 4 bytes an element
            t.view(-1)
    trace = prof.trace
    profile = trace.meta.device_profile

    def kernel_ns(n: int) -> int:
        return profile["kernel_min_ns"] + round(3 * 4 * n / profile["memory_bandwidth"] * 1e9)

    calls = n_small + n_big
    add = next(o for o in trace.ops if o.op == "aten::add")
    assert (add.calls, add.device) == (calls, "cuda:0")
    assert add.host_ns == calls * profile["launch_ns"]
    assert add.device_ns == n_small * kernel_ns(1000) + n_big * kernel_ns(100_000)
    assert add.run_ns > 0  # what the host took to compute it, measured
    row = next(e for e in trace.events if e.name == "aten::add")
    assert (row.calls, row.cpu_ns, row.gpu_ns) == (calls, add.host_ns, add.device_ns)
    assert row.min_ns == profile["launch_ns"] + kernel_ns(1000)
    assert row.max_ns == profile["launch_ns"] + kernel_ns(100_000)
    view = next(o for o in trace.ops if o.op == "aten::view")
    assert (view.calls, view.device, view.device_ns) == (calls, "cuda:0", 0)
    assert view.host_ns == view.run_ns > 0
    row = next(e for e in trace.events if e.name == "aten::view")
    assert row.calls == calls and 0 < row.min_ns <= row.max_ns <= view.host_ns


def test_dataloader_workers_and_pin_memory_thread():
    """The pin-memory thread runs outside the tracer's thread-local modes; it must still pin
    (the simulated way) so the program runs as on a GPU."""
    from torch.utils.data import DataLoader, TensorDataset

    torch.manual_seed(0)
    data = TensorDataset(torch.randn(64, 8), torch.randint(0, 2, (64,)))
    expected = sum(float(x.sum()) for x, _ in DataLoader(data, batch_size=16))
    with memcpy_doctor.profiler(device="sim") as prof:
        total = 0.0
        for x, _ in DataLoader(data, batch_size=16, num_workers=2, pin_memory=True):
            assert x.is_pinned()
            total += float(x.to("cuda", non_blocking=True).sum())
    assert total == expected
    htod = [c for c in prof.trace.copies if c.direction == "HtoD"]
    assert [(c.sync, c.pinned, c.calls) for c in htod] == [(False, True, 4)]


def test_threads_started_during_the_run_are_traced_and_the_patch_undone():
    import threading

    with memcpy_doctor.profiler(device="sim") as prof:
        worker = threading.Thread(target=lambda: torch.ones(2) * 2, name="prefetch")
        worker.start()
        worker.join()
    assert prof.trace.meta.untraced == []
    assert {(o.op, o.thread) for o in prof.trace.ops} == {("aten::ones", "prefetch"),
                                                          ("aten::mul", "prefetch")}
    assert "Threads traced: the main thread and prefetch" in prof.report()
    assert threading.Thread.start.__name__ == "start" and threading.Thread.start.__module__ == "threading"


def test_torch_compile_runs_compiled_and_its_region_is_traced():
    def f(x):
        return (x * 2).relu().sum()

    torch.manual_seed(0)
    x_host = torch.randn(16)
    expected = float(f(x_host))
    torch._dynamo.reset()
    with memcpy_doctor.profiler(device="sim") as prof:
        compiled = torch.compile(f)
        got = float(compiled(x_host.to("cuda")))
    torch._dynamo.reset()
    assert got == pytest.approx(expected, rel=1e-6)  # (Inductor's sum may add in another order)
    ops = {o.op for o in prof.trace.ops if o.device == "cuda:0"}  # fused: no op one by one
    assert ops == {"Torch-Compiled Region: 0/0"}
    assert [c.trigger for c in prof.trace.copies if c.direction == "DtoH"] == ["float"]


def test_sync_debug_mode_warns_and_raises_where_a_gpu_would():
    """torch.cuda.set_sync_debug_mode on the simulated GPU: a sync copy (item, a blocking
    .to to the host, a blocking .to to the device) and Stream.synchronize warn or raise as
    c10's memcpy_and_sync and stream_synchronize do; an async copy, copy_ into pageable
    memory with non_blocking=True (cudaMemcpyAsync: no warning on a GPU either) and
    torch.cuda.synchronize do not."""
    with memcpy_doctor.profiler(device="sim"):
        x = torch.ones(4, device="cuda")
        assert torch.cuda.get_sync_debug_mode() == 0
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            x.sum().item()  # default mode: silent
            torch.cuda.set_sync_debug_mode("warn")
            assert torch.cuda.get_sync_debug_mode() == 1
            x.sum().item()
            x.cpu()
            torch.ones(2).to("cuda")
            torch.cuda.Stream().synchronize()
            x.to("cpu", non_blocking=True)
            torch.ones(2).to("cuda", non_blocking=True)
            torch.empty(4).copy_(x, non_blocking=True)
            torch.cuda.synchronize()
        assert [(w.category, str(w.message)) for w in caught] == [
            (UserWarning, "called a synchronizing CUDA operation")] * 4
        torch.cuda.set_sync_debug_mode(2)
        with pytest.raises(RuntimeError, match="^called a synchronizing CUDA operation$"):
            x.sum().item()
        with pytest.raises(RuntimeError, match="invalid value of debug_mode"):
            torch.cuda.set_sync_debug_mode("loud")
        torch.cuda.set_sync_debug_mode("default")
        x.sum().item()


def test_non_blocking_from_pageable_memory_is_staged_and_sync():
    """`x.to("cuda", non_blocking=True)` from pageable memory: the driver stages it through
    its own pinned buffers while the host is blocked, so the copy is sync, pinned False, and
    still says that its call asked non_blocking. Its host time is the staging's: the launch
    plus the copy at pageable bandwidth, without waiting for the matmul queued before it and
    without sync_ns (Timeline.staged). The same call from pinned memory stays async and costs
    the host the launch alone; a blocking call says it did not ask."""
    tracer = Tracer(device="sim", log_transfers=8)
    with tracer:
        a = torch.ones(1024, 1024, device="cuda")
        a @ a  # a long kernel (0.1 ms on the device) queued ahead of the copies
        x = torch.ones(1000)
        y = x.to("cuda", non_blocking=True)
        z = x.pin_memory().to("cuda", non_blocking=True)
        w = x.to("cuda")
        assert y.is_cuda and z.is_cuda and w.is_cuda
    trace = tracer.trace
    profile = trace.meta.device_profile
    launch, setup = profile["launch_ns"], profile["copy_setup_ns"]
    pageable = setup + round(4000 / profile["copy_bandwidth"]["HtoD_pageable"] * 1e9)
    pinned = setup + round(4000 / profile["copy_bandwidth"]["HtoD_pinned"] * 1e9)
    assert (launch, pageable, pinned) == (5_000, 2_333, 2_167)  # the A100 profile's figures
    htod = sorted((c for c in trace.copies if c.direction == "HtoD"), key=lambda c: c.first_ns)
    assert [(c.sync, c.pinned, c.non_blocking, c.trigger, c.calls, c.bytes, c.host_ns,
             c.device_ns) for c in htod] == [
        (True, False, True, "to", 1, 4000, launch + pageable, pageable),
        (False, True, True, "to", 1, 4000, launch, pinned),
        (True, False, False, "to", 1, 4000, htod[2].host_ns, pageable),
    ]
    assert htod[2].host_ns > launch + pageable + profile["sync_ns"]  # it waited for the mm
    rows = {e.name: e for e in trace.events}
    assert (rows["GpuMemcpySync:CPU->GPU"].calls, rows["GpuMemcpyAsync:CPU->GPU"].calls) == (2, 1)
    assert [(t.direction, t.sync, t.pinned, t.non_blocking) for t in trace.transfers] == [
        ("HtoD", True, False, True), ("HtoD", False, True, True), ("HtoD", True, False, False)]


def test_copy_with_non_blocking_records_what_it_asked():
    """`copy_(src, non_blocking=True)`: to the device from pageable memory, staged and sync
    as `.to()`; to the host into pageable memory, a copy the host waits for (and sync-debug
    mode does not flag); into pinned memory, async. Each one says it asked non_blocking; an
    `.item()` says it did not."""
    with memcpy_doctor.profiler(device="sim") as prof:
        d = torch.empty(1000, device="cuda")
        d.copy_(torch.ones(1000), non_blocking=True)
        torch.empty(1000).copy_(d, non_blocking=True)
        torch.empty(1000).pin_memory().copy_(d, non_blocking=True)
        d[0].item()
    got = sorted((c.direction, c.sync, c.pinned, c.non_blocking, c.trigger)
                 for c in prof.trace.copies)
    assert got == [("DtoH", False, True, True, "copy_"), ("DtoH", True, False, False, "item"),
                   ("DtoH", True, False, True, "copy_"), ("HtoD", True, False, True, "copy_")]
    profile = prof.trace.meta.device_profile
    (htod,) = [c for c in prof.trace.copies if c.direction == "HtoD"]
    assert htod.host_ns == profile["launch_ns"] + htod.device_ns


def test_report_counts_pageable_non_blocking_copies_and_shows_the_peak():
    with memcpy_doctor.profiler(device="sim") as prof:
        x = torch.ones(1000)
        kept = [x.to("cuda", non_blocking=True) for _ in range(3)]
        kept.append(x.pin_memory().to("cuda", non_blocking=True))
    report = prof.report()
    assert ("\n  3 sync CPU->GPU copies asked non_blocking=True from pageable memory: the host "
            "stages pageable memory, so they block; pin the source\n") in report
    assert prof.trace.summary.peak_device_memory_bytes == 16_000
    assert "\nDevice memory peak: 15.6 KiB\n" in report


def test_pinning_costs_the_host_a_copy_at_its_memory_bandwidth():
    """`pin_memory()` copies into page-locked memory: the simulated host pays that copy, so a
    fix that pins every step is not graded free (issue 40); DataLoader's pinning in the main
    thread (num_workers=0) pays it too."""
    from torch.utils.data import DataLoader, TensorDataset

    from memcpy_doctor.core.costmodel import load_profile

    profile = load_profile()
    x = torch.ones(1 << 20)  # 4 MiB
    totals = []
    for pin in (False, True):
        with memcpy_doctor.profiler(device="sim") as prof:
            y = x.pin_memory() if pin else x
            assert y.is_pinned() == pin
        totals.append(prof.trace.summary.total_ns)
    assert totals[1] - totals[0] == profile.host_op_ns + int(x.nbytes / 1e10 * 1e9)
    assert profile.host_memory_bandwidth == 1e10
    loaders = []
    for pin in (False, True):
        with memcpy_doctor.profiler(device="sim") as prof:
            for (batch,) in DataLoader(TensorDataset(x.view(4, -1)), batch_size=2,
                                       pin_memory=pin):
                assert batch.is_pinned() == pin
        loaders.append(prof.trace.summary.total_ns)
    assert loaders[1] - loaders[0] == 2 * (profile.host_op_ns + int(x.nbytes / 2 / 1e10 * 1e9))


def test_save_on_cpu_with_pinned_memory_runs_and_packs_without_a_sync():
    """`save_on_cpu(pin_memory=True)` pins in its pack hook, where the function mode does not
    see the factory (issue 41: it raised "pin_memory=True requires a CUDA ... backend"); it
    packs with non_blocking into pinned memory: async copies, as PyTorch's tests expect."""
    with memcpy_doctor.profiler(device="sim") as prof:
        d = torch.full((8, 8), 3.0, device="cuda", requires_grad=True)
        with torch.autograd.graph.save_on_cpu(pin_memory=True):
            y = (d * d).sum()
        y.backward()
        grad = d.grad.cpu()
    assert torch.equal(grad, torch.full((8, 8), 6.0))
    packs = [c for c in prof.trace.copies if c.trigger == "copy_"]
    assert [(c.direction, c.sync, c.pinned, c.non_blocking, c.calls) for c in packs] == [
        ("DtoH", False, True, True, 2)]
