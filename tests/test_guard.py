"""device_guard: Paddle's placement rules in eager PyTorch, on the host alone and under the
profiler (simulated GPU, and a real one where there is one), where every copy the guard makes
must be recorded at its line."""

from __future__ import annotations

import copy
import gc
import pickle
import threading
import weakref

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import memcpy_doctor
from memcpy_doctor.guards.device import device_guard, guarded_device, parse_device
from memcpy_doctor.core.trace import Trace
from triggers_util import check

CPU = torch.device("cpu")
CUDA0 = torch.device("cuda", 0)
_hooks = torch.nn.modules.module
HOOK_DICTS = (_hooks._global_parameter_registration_hooks,
              _hooks._global_buffer_registration_hooks,
              _hooks._global_module_registration_hooks)


@pytest.fixture(params=["sim", pytest.param("cuda", marks=pytest.mark.cuda)])
def device(request):
    """The profiler's device: the simulated GPU, and the real one where there is one (the
    guard must make the copies a real GPU makes)."""
    return request.param


def hook_counts() -> tuple[int, ...]:
    return tuple(len(d) for d in HOOK_DICTS)


class Net(nn.Module):
    """Origin example 1 plus a linear layer: only the embedding is built under the guard."""

    def __init__(self, vocab: int, dim: int = 150) -> None:
        super().__init__()
        with device_guard("cpu"):
            self.emb = nn.Embedding(vocab, dim)
        self.fc = nn.Linear(dim, dim)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return F.normalize(self.fc(self.emb(ids)), p=2, dim=-1)


class Pair(nn.Module):
    """A module with no guard of its own, for building entirely under one."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(3, 3)
        self.b = nn.Linear(3, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(self.a(x))


# ----- device names -----

@pytest.mark.parametrize("name, expected", [
    ("cpu", CPU), ("cuda", torch.device("cuda")), ("cuda:1", torch.device("cuda", 1)),
    ("gpu", torch.device("cuda")), ("gpu:0", CUDA0), ("gpu:12", torch.device("cuda", 12)),
])
def test_device_names(name, expected):
    assert parse_device(name) == expected
    guard = device_guard(name)
    assert guard.device == expected and repr(guard) == f"device_guard({name!r})"


@pytest.mark.parametrize("name", ["tpu", "GPU", "Cuda", "cpu:0", "cuda:", "gpu:", "cuda:-1",
                                  "cuda:x", "gpu:0:1", " cpu", "", "xpu", "meta", None, 0,
                                  CPU])
def test_bad_device_names_raise_value_error(name):
    with pytest.raises(ValueError, match="device_guard: device must be 'cpu', 'cuda', "
                                         "'cuda:N', 'gpu' or 'gpu:N', not "):
        device_guard(name)


# ----- on the host alone -----

def test_cpu_guard_in_plain_code_leaves_nothing_behind():
    hooks_before = hook_counts()
    assert torch._C._len_torch_function_stack() == 0
    with device_guard("cpu") as guard:
        assert guard.device == CPU
        assert torch._C._len_torch_function_stack() == 1
        assert hook_counts() == tuple(n + 1 for n in hooks_before)
        made = [torch.zeros(2), torch.ones(2), torch.empty(2), torch.full((2,), 3.0),
                torch.rand(2), torch.randn(2), torch.randint(0, 5, (2,)), torch.arange(3),
                torch.linspace(0, 1, 4), torch.eye(2), torch.tensor([1.0]),
                torch.as_tensor([1, 2]), torch.zeros_like(torch.ones(2)),
                torch.ones(2).new_zeros(3)]
        assert [t.device for t in made] == [CPU] * len(made)
        x = torch.arange(6.0).reshape(2, 3)
        assert torch.equal(x @ x.t(), torch.tensor([[5.0, 14.0], [14.0, 50.0]]))
        assert torch.zeros(2, device="meta").device == torch.device("meta")  # explicit
    assert torch._C._len_torch_function_stack() == 0
    assert hook_counts() == hooks_before


def test_an_exception_inside_the_guard_unwinds_everything():
    hooks_before = hook_counts()
    with pytest.raises(KeyError, match="boom"):
        with device_guard("cpu"):
            with device_guard("gpu"):
                assert torch._C._len_torch_function_stack() == 2
                raise KeyError("boom")
    assert torch._C._len_torch_function_stack() == 0
    assert hook_counts() == hooks_before
    with device_guard("cpu"):  # and the guard still works afterwards
        assert torch.zeros(1).device == CPU
    assert torch._C._len_torch_function_stack() == 0


def test_a_guard_is_reentrant_and_a_decorator():
    guard = device_guard("cpu")

    @device_guard("cpu")
    def make() -> torch.Tensor:
        assert torch._C._len_torch_function_stack() == 1
        return torch.ones(2)

    with guard:
        with guard:
            assert torch._C._len_torch_function_stack() == 2
        assert torch._C._len_torch_function_stack() == 1
    assert make().device == CPU
    assert torch._C._len_torch_function_stack() == 0


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks a build without CUDA")
def test_cuda_guard_without_cuda_fails_as_torch_does():
    def error_of(fn):
        with pytest.raises(BaseException) as info:
            fn()
        return type(info.value), str(info.value)

    h = torch.ones(2)
    scalar = torch.tensor(2.0)
    with device_guard("cuda"):  # entering touches no CUDA
        factory_error = error_of(lambda: torch.zeros(2))
        op_error = error_of(lambda: h + 1)
        assert (scalar * 3).device == CPU  # a 0-dim host tensor is not copied
        assert h.shape == (2,) and h.device == CPU  # queries copy nothing
    assert factory_error == error_of(lambda: torch.zeros(2, device="cuda"))
    assert op_error == error_of(lambda: h.to("cuda"))


def test_modules_built_under_the_guard_keep_their_device():
    model = Net(10)
    assert guarded_device(model) is None and guarded_device(model.fc) is None
    assert guarded_device(model.emb) == CPU
    model.to("meta")
    assert model.emb.weight.device == CPU and model.fc.weight.device.type == "meta"
    model.to(torch.float64)  # dtype changes still apply
    assert model.emb.weight.dtype == torch.float64 and model.emb.weight.device == CPU
    model.to_empty(device="meta")
    assert model.emb.weight.device == CPU
    assert model.emb.weight.shape == (10, 150)
    assert torch._C._len_torch_function_stack() == 0


def test_what_counts_as_built_under_the_guard():
    with device_guard("cpu"):
        pair = Pair()  # built inside: the container and its layers
        seq = nn.Sequential(nn.Linear(2, 2), nn.ReLU())
        relu = nn.ReLU()  # registers nothing: nothing to keep anywhere
        outside = nn.Linear(2, 2, device="meta")  # explicit device: built there
    late = nn.Linear(2, 2)
    with device_guard("cpu"):
        late.register_buffer("extra", torch.zeros(1))  # changed, not built, inside
    built_in_thread = []
    with device_guard("cpu"):
        worker = threading.Thread(target=lambda: built_in_thread.append(nn.Linear(2, 2)))
        worker.start()
        worker.join()
    assert [guarded_device(m) for m in (pair, pair.a, pair.b, seq, seq[0])] == [CPU] * 5
    assert [guarded_device(m) for m in (relu, late, built_in_thread[0])] == [None] * 3
    assert guarded_device(outside) == CPU and outside.weight.device.type == "meta"
    pair.to("meta")
    assert all(p.device == CPU for p in pair.parameters())


def test_nested_guards_innermost_wins_for_modules():
    class Outer(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.host = nn.Linear(2, 2)
            with device_guard("gpu"):
                self.device_side = nn.Linear(2, 2, device="meta")

    with device_guard("cpu"):
        outer = Outer()
    assert guarded_device(outer) == CPU and guarded_device(outer.host) == CPU
    assert guarded_device(outer.device_side) == torch.device("cuda")


def test_guarded_forward_runs_under_the_guard_and_unwinds_on_error():
    class Boom(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w = nn.Parameter(torch.ones(2))

        def forward(self, x):
            assert torch._C._len_torch_function_stack() == 1
            raise ValueError("inside forward")

    with device_guard("cpu"):
        boom = Boom()
    with pytest.raises(ValueError, match="inside forward"):
        boom(torch.ones(2))
    assert torch._C._len_torch_function_stack() == 0


def test_a_guarded_module_is_freed_without_the_garbage_collector():
    with device_guard("cpu"):
        emb = nn.Embedding(100, 8)
    ref = weakref.ref(emb)
    gc.disable()
    try:
        del emb
        assert ref() is None
    finally:
        gc.enable()


def test_copies_of_a_guarded_module_are_guarded_and_their_own():
    torch.manual_seed(0)
    model = Net(10)
    ids = torch.tensor([3])
    for twin in (copy.deepcopy(model), pickle.loads(pickle.dumps(model))):
        assert guarded_device(twin.emb) == CPU
        with torch.no_grad():
            twin.emb.weight.zero_()
        expected = F.normalize(twin.fc.bias.detach().unsqueeze(0), p=2, dim=-1)
        assert torch.equal(twin(ids).detach(), expected)  # the twin's forward, its weights
        assert not torch.equal(model(ids).detach(), expected)
        twin.to("meta")
        assert twin.emb.weight.device == CPU


# ----- under the profiler: the copies a real GPU makes, each at its line -----

def test_factories_under_a_cuda_guard_are_on_the_device(tmp_path, device):
    check(tmp_path, """
        import torch
        from memcpy_doctor.guards.device import device_guard
        h = torch.ones(2)
        host_out = torch.empty(2)
        with device_guard("cuda"):
            made = [torch.zeros(2), torch.ones(2), torch.empty(2), torch.full((2,), 3.0),
                    torch.rand(2), torch.randn(2), torch.randint(0, 5, (2,)), torch.arange(3),
                    torch.linspace(0, 1, 4), torch.eye(2), torch.zeros_like(h), h.new_ones(3)]
            a = torch.tensor([1.0, 2.0])  # expect: HtoD sync factory
            b = torch.as_tensor([1, 2])  # expect: HtoD sync factory
            c = torch.zeros(2, device="cpu")
            d = torch.ones(2, out=host_out)
        assert all(t.device == torch.device("cuda", 0) for t in made + [a, b]), made
        assert c.device.type == "cpu" and d.device.type == "cpu"
        assert torch.zeros(1).device.type == "cpu"
    """, device)


def test_ops_copy_their_inputs_to_the_guard_device(tmp_path, device):
    check(tmp_path, """
        import torch
        from memcpy_doctor.guards.device import device_guard
        d = torch.arange(4.0, device="cuda")
        h = torch.ones(4)
        scalar = torch.tensor(2.0)
        with device_guard("cpu"):
            y = d * 2  # expect: DtoH sync to
            z = torch.cat([d, h])  # expect: DtoH sync to
            w = h + scalar
        with device_guard("cuda"):
            u = h + 1  # expect: HtoD sync to
            v = d * scalar
            s = (d + h).sum()  # expect: HtoD sync to
        assert (y.device.type, z.device.type, w.device.type) == ("cpu", "cpu", "cpu")
        assert (u.device.type, v.device.type, s.device.type) == ("cuda", "cuda", "cuda")
        assert y.tolist() == [0.0, 2.0, 4.0, 6.0] and s.item() == 10.0  # expect: DtoH sync item
    """, device)


def test_explicit_transfers_queries_and_views_are_honoured(tmp_path, device):
    check(tmp_path, """
        import torch
        from memcpy_doctor.guards.device import device_guard
        h = torch.ones(2, 3)
        d = torch.ones(2, 3, device="cuda")
        with device_guard("cpu"):
            a = h.to("cuda")  # expect: HtoD sync to
            b = h.cuda()  # expect: HtoD sync cuda
            info = (d.device, d.shape, d.is_cuda, d.dtype, d.size(), d.dim(), d.numel(),
                    d.stride(), len(d), d.requires_grad, d.get_device(), d.is_contiguous())
            views = [d[0], d[:, 1:], d.view(-1), d.t(), d.T, d.detach(), d.unsqueeze(0)]
        e = torch.empty(2, 3)
        with device_guard("cuda"):
            c = d.cpu()  # expect: DtoH sync cpu
            e.copy_(d)  # expect: DtoH sync copy_
            f = d.to(torch.float64)
        assert (a.device.type, b.device.type, c.device.type) == ("cuda", "cuda", "cpu")
        assert e.device.type == "cpu" and f.device.type == "cuda"
        assert info[0] == torch.device("cuda", 0) and info[1] == (2, 3) and info[2]
        assert all(v.device.type == "cuda" for v in views)
    """, device)


def test_writes_into_a_tensor_elsewhere_land_in_it(tmp_path, device):
    check(tmp_path, """
        import torch
        import torch.nn.functional as F
        from memcpy_doctor.guards.device import device_guard
        a, b, c, e, f, out = (torch.arange(4.0, device="cuda") - 1 for _ in range(6))
        with device_guard("cpu"):
            r = a.add_(1)  # expect: DtoH sync to; HtoD sync copy_
            b[0] = 5.0  # expect: DtoH sync to; HtoD sync copy_
            c[2:].mul_(3)  # a view of c, then the op  # expect: DtoH sync to; HtoD sync copy_
            torch.add(b, 1, out=out)  # expect: DtoH sync to; DtoH sync to; HtoD sync copy_
            s = F.relu(e, True)  # expect: DtoH sync to; HtoD sync copy_
            f += 1  # expect: DtoH sync to; HtoD sync copy_
        assert r is a and s is e and all(t.device.type == "cuda" for t in (a, b, c, e, f, out))
        assert a.tolist() == [0.0, 1.0, 2.0, 3.0]  # expect: DtoH sync tolist
        assert b.tolist() == [5.0, 0.0, 1.0, 2.0]  # expect: DtoH sync tolist
        assert c.tolist() == [-1.0, 0.0, 3.0, 6.0]  # expect: DtoH sync tolist
        assert out.tolist() == [6.0, 1.0, 2.0, 3.0]  # expect: DtoH sync tolist
        assert e.tolist() == [0.0, 0.0, 1.0, 2.0]  # expect: DtoH sync tolist
        assert f.tolist() == [0.0, 1.0, 2.0, 3.0]  # expect: DtoH sync tolist
    """, device)


def test_an_optimizer_step_under_a_guard_updates_the_parameters_in_place(tmp_path, device):
    check(tmp_path, """
        import torch
        from memcpy_doctor.guards.device import device_guard
        p = torch.nn.Parameter(torch.ones(3))
        p.grad = torch.full((3,), 2.0)
        opt = torch.optim.SGD([p], lr=0.5, foreach=True)
        with device_guard("cuda"):
            opt.step()  # expect: HtoD sync to; HtoD sync to; DtoH sync copy_
        assert p.device.type == "cpu" and p.tolist() == [0.0] * 3
    """, device)


def test_nested_guards_innermost_wins(tmp_path, device):
    check(tmp_path, """
        import torch
        from memcpy_doctor.guards.device import device_guard
        with device_guard("gpu:0"):
            a = torch.zeros(2)
            with device_guard("cpu"):
                b = torch.zeros(2)
                c = a + 1  # expect: DtoH sync to
                with device_guard("gpu"):
                    e = b + 1  # expect: HtoD sync to
            d = torch.zeros(2)
            f = c + a  # expect: HtoD sync to
        devices = [t.device.type for t in (a, b, c, d, e, f)]
        assert devices == ["cuda", "cpu", "cpu", "cuda", "cuda", "cuda"], devices
    """, device)


def test_backward_follows_the_forward_device(tmp_path, device):
    trace = check(tmp_path, """
        import torch
        from memcpy_doctor.guards.device import device_guard
        w = torch.ones(3, device="cuda", requires_grad=True)
        with device_guard("cpu"):
            y = (w * 3).sum()  # expect: DtoH sync to
        y.backward()  # expect: HtoD sync backward
        assert w.grad.device.type == "cuda"
        assert w.grad.tolist() == [3.0] * 3  # expect: DtoH sync tolist
    """, device)
    mul = sorted((o.site.line, o.device, o.calls) for o in trace.ops if o.op == "aten::mul")
    assert mul == [(6, "cpu", 1), (7, "cpu", 1)]  # forward at line 6, its backward at 7
    back = next(c for c in trace.copies if c.trigger == "backward")
    assert (back.producer.op, back.producer.device) == ("aten::mul", "cpu")


def test_a_guarded_module_called_under_a_guard_leaves_its_outputs(tmp_path, device):
    check(tmp_path, """
        import torch
        from memcpy_doctor.guards.device import device_guard
        with device_guard("cpu"):
            emb = torch.nn.Embedding(10, 4)
        ids = torch.tensor([1, 2], device="cuda")  # expect: HtoD sync factory
        rows = emb(ids)  # expect: DtoH sync to; HtoD sync to
        with device_guard("cuda"):
            inner = emb(ids)  # expect: DtoH sync to
            doubled = inner * 2  # expect: HtoD sync to
        assert (rows.device.type, inner.device.type, doubled.device.type) == ("cuda", "cpu", "cuda")
    """, device)


def test_module_built_under_a_cuda_guard_stays_there(tmp_path, device):
    check(tmp_path, """
        import torch
        from memcpy_doctor.guards.device import device_guard
        with device_guard("cuda"):
            lin = torch.nn.Linear(4, 2)
        model = torch.nn.Sequential(lin, torch.nn.ReLU())
        model.cpu()
        assert lin.weight.device.type == "cuda"
        out = model(torch.ones(3, 4))  # expect: HtoD sync to; DtoH sync to
        assert out.device.type == "cpu"
    """, device)


def test_the_embedding_model_keeps_its_table_on_the_host(device):
    """Origin example 1: the embedding under device_guard("cpu"), the rest on cuda; three
    training steps give the numbers of a run all on the host (the very numbers on the
    simulated GPU), and the table (vocab x 150 float32) is never copied."""
    vocab, steps = 1000, 3

    def train(on: str) -> tuple[list[float], Net]:
        torch.manual_seed(0)
        model = Net(vocab).to(on)
        opt = torch.optim.SGD(model.parameters(), lr=0.001)
        ids = torch.full([1], 128, dtype=torch.int64, device=on)
        label = torch.full([1, 150], 0.5, device=on)
        losses = []
        for _ in range(steps):
            out = model(ids)
            assert out.device == ids.device
            loss = F.mse_loss(out, label).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
        return losses, model

    want_losses, want = train("cpu")
    with memcpy_doctor.profiler(device=device) as prof:
        losses, model = train("cuda")
        assert model.emb.weight.device == CPU and model.emb.weight.grad.device == CPU
        assert model.fc.weight.device == CUDA0 and model.fc.weight.grad.device == CUDA0
        assert torch.cuda.memory_allocated() < vocab * 150 * 4
    same = torch.equal if device == "sim" else torch.allclose  # a real GPU rounds otherwise
    assert same(torch.tensor(losses), torch.tensor(want_losses))
    assert same(model.emb.weight, want.emb.weight)
    assert same(model.fc.weight.detach().cpu(), want.fc.weight)

    trace: Trace = prof.trace
    copies = sorted((c.direction, c.trigger, c.calls, c.bytes, c.site.function)
                    for c in trace.copies)
    assert copies == [
        ("DtoH", "backward", steps, steps * 600, "test_the_embedding_model_keeps_its_table"
                                                 "_on_the_host.<locals>.train"),
        ("DtoH", "item", steps, steps * 4, "test_the_embedding_model_keeps_its_table_on_the"
                                           "_host.<locals>.train"),
        ("DtoH", "to", steps, steps * 8, "Net.forward"),  # ids to the host for the lookup
        ("HtoD", "to", 1, 150 * 4, "test_the_embedding_model_keeps_its_table_on_the_host"
                                   ".<locals>.train"),  # model.to("cuda"): fc's bias,
        ("HtoD", "to", 1, 150 * 150 * 4, "test_the_embedding_model_keeps_its_table_on_the"
                                         "_host.<locals>.train"),  # and weight, no table
        ("HtoD", "to", steps, steps * 600, "Net.forward"),  # the lookup's rows back to cuda
    ]
    assert all(c.sync for c in trace.copies)
    ops = {(o.op, o.device) for o in trace.ops}
    assert {("aten::embedding", "cpu"), ("aten::embedding_dense_backward", "cpu"),
            ("aten::addmm", "cuda:0")} <= ops
    assert not {("aten::embedding", "cuda:0"), ("aten::addmm", "cpu")} & ops


def test_gpu_names_mean_cuda_under_the_simulated_gpu():
    with memcpy_doctor.profiler(device="sim") as prof:
        with device_guard("gpu:0"):
            a = torch.zeros(2)
        with device_guard("gpu"):
            b = torch.ones(2)
        with device_guard("cuda:0"):
            c = torch.ones(2) + a
        assert (a.device, b.device, c.device) == (CUDA0, CUDA0, CUDA0)
        with device_guard("gpu:1"), pytest.raises(RuntimeError, match="invalid device ordinal"):
            torch.zeros(2)
    assert prof.trace.copies == []
