"""transfer_guard: allow, log or refuse host<->GPU copies, per level and direction, at the
user's line; standalone (its own tracer) and inside a running profiler; on the simulated GPU,
and on a real one where there is one."""

from __future__ import annotations

import logging
import os
import sys
import threading
import traceback

import pytest
import torch
import torch.nn as nn

import memcpy_doctor
from memcpy_doctor.tracer import active_tracer
from memcpy_doctor.guards.transfer import (EXPLICIT_TRIGGERS, LEVELS, TransferGuardError,
                                           parse_levels, transfer_guard)

HERE = os.path.abspath(__file__)
_LIBRARY_ROOTS = tuple(os.path.dirname(os.path.abspath(m.__file__)) + os.sep
                       for m in (torch, memcpy_doctor))


def next_line() -> int:
    """The line after the caller's: where the statement under test is."""
    return sys._getframe(1).f_lineno + 1


def last_user_frame(excinfo: pytest.ExceptionInfo) -> tuple[str, int]:
    """The innermost traceback frame outside torch and memcpy_doctor."""
    frames = [f for f in traceback.extract_tb(excinfo.tb)
              if not os.path.abspath(f.filename).startswith(_LIBRARY_ROOTS)]
    return os.path.abspath(frames[-1].filename), frames[-1].lineno


@pytest.fixture
def prof():
    """A running profiler on the simulated GPU (the guard uses it, does not stop it)."""
    with memcpy_doctor.profiler(device="sim") as p:
        yield p


@pytest.fixture(params=["sim", pytest.param("cuda", marks=pytest.mark.cuda)])
def device(request):
    return request.param


# ----- what each user statement does; the trigger the tracer names it by -----

def _dev() -> torch.Tensor:
    return torch.arange(4.0, device="cuda")


IMPLICIT = {
    "item": lambda: _dev().sum().item(),
    "float": lambda: float(_dev().sum()),
    "int": lambda: int(_dev().sum()),
    "bool": lambda: bool(_dev()[1]),
    "if": lambda: 1 if _dev()[1] else 0,
    "index": lambda: range(10)[_dev().long()[1]],
    "print": lambda: repr(_dev()),
    "str": lambda: str(_dev()),
    "fstring_scalar": lambda: f"{_dev().sum()}",
    "tolist": lambda: _dev().tolist(),
    "nonzero": lambda: _dev().nonzero(),
    "where1": lambda: torch.where(_dev() > 1),
    "mask": lambda: _dev()[_dev() > 1],
    "mask_set": lambda: _dev().__setitem__(_dev() > 1, _dev()[0]),
    "masked_select": lambda: torch.masked_select(_dev(), _dev() > 1),
    "unique": lambda: torch.unique(_dev()),
    "bincount": lambda: torch.bincount(_dev().long()),
    "repeat_interleave": lambda: torch.repeat_interleave(_dev().long()),
    "host_index": lambda: _dev()[torch.tensor([0, 2])],
    "equal": lambda: torch.equal(_dev(), _dev()),
    "allclose": lambda: torch.allclose(_dev(), _dev()),
}

EXPLICIT = {
    "to": lambda: torch.ones(3).to("cuda"),
    # (not named "cuda": a test id "cuda" is a keyword conftest reads as the cuda marker)
    "dot_cuda": lambda: torch.ones(3).cuda(),
    "cpu": lambda: _dev().cpu(),
    "to_cpu": lambda: _dev().to("cpu"),
    "copy_htod": lambda: _dev().copy_(torch.ones(4)),
    "copy_dtoh": lambda: torch.empty(4).copy_(_dev()),
    "factory": lambda: torch.tensor([1.0, 2.0], device="cuda"),
    "as_tensor": lambda: torch.as_tensor([1.0, 2.0], device="cuda"),
    "new_tensor": lambda: _dev().new_tensor([1.0]),
    "module_to": lambda: nn.Linear(2, 2).to("cuda"),
    "non_blocking": lambda: torch.ones(3).pin_memory().to("cuda", non_blocking=True),
}


def _backward() -> None:
    w = torch.ones(3, requires_grad=True)
    (w.cuda() * 2).sum().backward()  # the gradient comes back DtoH: trigger "backward"


def test_explicit_triggers_are_the_documented_ones():
    assert EXPLICIT_TRIGGERS == {"to", "cuda", "cpu", "copy_", "factory", "backward"}
    assert LEVELS == ("allow", "log", "disallow", "disallow_explicit")


# ----- levels -----

@pytest.mark.parametrize("name", sorted(IMPLICIT))
def test_disallow_refuses_implicit(name, prof):
    with transfer_guard("disallow"):
        with pytest.raises(TransferGuardError) as e:
            IMPLICIT[name]()
    assert e.value.level == "disallow"
    assert e.value.event.trigger not in EXPLICIT_TRIGGERS
    assert isinstance(e.value, RuntimeError)


@pytest.mark.parametrize("name", sorted(EXPLICIT))
def test_disallow_allows_explicit(name, prof):
    with transfer_guard("disallow"):
        EXPLICIT[name]()
        _backward()
    triggers = {c.trigger for c in prof.tracer.stop().copies}  # made and recorded
    assert "backward" in triggers and triggers <= EXPLICIT_TRIGGERS


@pytest.mark.parametrize("name", sorted(EXPLICIT))
def test_disallow_explicit_refuses_explicit(name, prof):
    with transfer_guard("disallow_explicit"):
        with pytest.raises(TransferGuardError) as e:
            EXPLICIT[name]()
    assert e.value.level == "disallow_explicit"
    assert e.value.event.trigger in EXPLICIT_TRIGGERS


@pytest.mark.parametrize("name", ["item", "mask", "print", "host_index"])
def test_disallow_explicit_refuses_implicit(name, prof):
    with transfer_guard("disallow_explicit"), pytest.raises(TransferGuardError):
        IMPLICIT[name]()


def test_disallow_explicit_refuses_the_backward_copy(prof):
    w = torch.ones(3, requires_grad=True)
    with transfer_guard("disallow_explicit", directions="DtoH"):
        loss = (w.cuda() * 2).sum()
        with pytest.raises(TransferGuardError) as e:
            loss.backward()
    assert e.value.event.trigger == "backward" and e.value.event.direction == "DtoH"


def test_allow_does_nothing(prof, caplog):
    caplog.set_level(logging.DEBUG, logger="memcpy_doctor.transfer_guard")
    with transfer_guard("allow"):
        for f in (*IMPLICIT.values(), *EXPLICIT.values()):
            f()
    assert caplog.records == []


def test_log_logs_every_copy_with_op_direction_bytes_and_line(prof, caplog):
    caplog.set_level(logging.WARNING, logger="memcpy_doctor.transfer_guard")
    with transfer_guard("log"):
        line_cuda = next_line()
        d = torch.ones(3).cuda()
        line_item = next_line()
        value = d.sum().item()
    assert value == 3.0  # logging lets the copy happen
    records = [r for r in caplog.records if r.name == "memcpy_doctor.transfer_guard"]
    assert len(records) == 2
    cuda, item = records
    assert cuda.levelno == logging.WARNING
    here = os.path.relpath(HERE)
    assert cuda.getMessage() == (f"transfer_guard: explicit HtoD copy `cuda` (sync), 12 B, "
                                 f"float32 tensor of shape (3,) at {here}:{line_cuda}")
    assert item.getMessage() == (f"transfer_guard: implicit DtoH copy `item` (sync), 4 B, "
                                 f"float32 tensor of shape () at {here}:{line_item}")
    # the record points at the user's line, so %(pathname)s:%(lineno)d formats name it
    assert (item.pathname, item.lineno, item.funcName) == (
        HERE, line_item, "test_log_logs_every_copy_with_op_direction_bytes_and_line")
    assert item.copy_event.trigger == "item" and item.copy_event.nbytes == 4


def test_log_is_silent_when_the_logger_is_off(prof, caplog):
    caplog.set_level(logging.ERROR, logger="memcpy_doctor.transfer_guard")
    with transfer_guard("log"):
        _dev().sum().item()
    assert caplog.records == []


# ----- the error: where and what -----

def test_raises_at_the_users_line_with_a_full_message(prof):
    d = _dev()
    with transfer_guard("disallow"):
        with pytest.raises(TransferGuardError) as e:
            line = next_line()
            d[d > 1]
    assert last_user_frame(e) == (HERE, line)
    ev = e.value.event
    assert (ev.direction, ev.trigger, ev.nbytes, ev.dtype, ev.shape) == ("DtoH", "mask", 4,
                                                                         "bool", [4])
    assert (ev.site.file, ev.site.line) == (HERE, line)
    msg = str(e.value)
    assert msg.startswith(f"transfer_guard: implicit DtoH copy `mask` (sync), 4 B, bool tensor "
                          f"of shape (4,) at {os.path.relpath(HERE)}:{line} is not allowed")
    assert "level 'disallow' refuses implicit copies" in msg


def test_raises_at_the_users_line_from_a_helper_function(prof):
    def helper(t):
        return t.item()
    inner = next_line() - 2
    with transfer_guard("disallow"), pytest.raises(TransferGuardError) as e:
        helper(_dev().sum())
    assert last_user_frame(e) == (HERE, inner)


def test_disallow_explicit_message_names_the_level_and_direction(prof):
    with transfer_guard("disallow_explicit"), pytest.raises(TransferGuardError) as e:
        line = next_line()
        torch.zeros(2, 5, dtype=torch.float16).to("cuda")
    assert last_user_frame(e) == (HERE, line)
    assert str(e.value) == (
        f"transfer_guard: explicit HtoD copy `to` (sync), 20 B, float16 tensor of shape "
        f"(2, 5) at {os.path.relpath(HERE)}:{line} is not allowed (level 'disallow_explicit' "
        f"refuses every HtoD copy)")


def test_a_refused_copy_is_not_recorded_and_the_profiler_goes_on(prof):
    d = _dev()
    with transfer_guard("disallow"):
        with pytest.raises(TransferGuardError):
            d.sum().item()
        d.cpu()
    assert active_tracer() is prof.tracer
    d.sum().item()
    trace = prof.tracer.stop()
    assert sorted((c.trigger, c.calls) for c in trace.copies) == [("cpu", 1), ("item", 1)]


# ----- directions -----

def test_directions_limit_the_level(prof):
    with transfer_guard("disallow_explicit", directions=("HtoD",)):
        d = _dev()
        d.cpu()  # DtoH: not named, allowed
        d.sum().item()
        with pytest.raises(TransferGuardError) as e:
            torch.ones(2).cuda()
    assert e.value.event.direction == "HtoD"


def test_a_direction_may_be_one_string(prof):
    with transfer_guard("disallow", directions="DtoH"):
        _dev()[torch.tensor([1])]  # HtoD implicit: allowed
        with pytest.raises(TransferGuardError):
            _dev().tolist()


def test_a_mapping_gives_a_level_per_direction(prof, caplog):
    caplog.set_level(logging.WARNING, logger="memcpy_doctor.transfer_guard")
    with transfer_guard({"HtoD": "log", "DtoH": "disallow"}):
        d = torch.ones(2).cuda()  # logged
        d.cpu()  # explicit DtoH: allowed
        with pytest.raises(TransferGuardError):
            d.sum().item()
    assert [r.copy_event.trigger for r in caplog.records] == ["cuda"]


@pytest.mark.parametrize("args, message", [
    (("forbid",), "unknown level 'forbid'"),
    (("disallow", ("HtoX",)), "unknown direction 'HtoX'"),
    (("disallow", ()), "directions is empty"),
    (({"HtoD": "nope"},), "unknown level 'nope'"),
    (({"HtoD": "allow"}, ("DtoH",)), "not both"),
])
def test_bad_arguments(args, message):
    with pytest.raises(ValueError, match=message):
        transfer_guard(*args)
    assert active_tracer() is None


def test_parse_levels():
    assert parse_levels("log") == {"HtoD": "log", "DtoH": "log", "DtoD": "log"}
    assert parse_levels("disallow", ["DtoH"]) == {"DtoH": "disallow"}
    assert parse_levels({"DtoD": "allow"}) == {"DtoD": "allow"}


# ----- nesting -----

def test_nested_guards_innermost_wins(prof):
    d = _dev()
    with transfer_guard("disallow"):
        with transfer_guard("allow"):
            d.sum().item()
        with pytest.raises(TransferGuardError):
            d.sum().item()  # the outer guard again
        with transfer_guard("disallow_explicit"):
            with pytest.raises(TransferGuardError):
                d.cpu()
        d.cpu()


def test_an_inner_guard_overrides_only_the_directions_it_names(prof):
    d = _dev()
    with transfer_guard("disallow_explicit"):
        with transfer_guard("allow", directions=("DtoH",)):
            d.cpu()
            d.sum().item()
            with pytest.raises(TransferGuardError) as e:
                torch.ones(1).cuda()
    assert e.value.level == "disallow_explicit"


def test_inner_log_inside_outer_disallow_logs_instead(prof, caplog):
    caplog.set_level(logging.WARNING, logger="memcpy_doctor.transfer_guard")
    with transfer_guard("disallow"), transfer_guard("log"):
        _dev().sum().item()
    assert len(caplog.records) == 1  # logged once, by the inner guard only


def test_nested_standalone_guards_share_the_outer_tracer():
    with transfer_guard("disallow", device="sim"):
        outer = active_tracer()
        with transfer_guard("allow", device="sim"):
            assert active_tracer() is outer
            _dev().sum().item()
        assert active_tracer() is outer
        with pytest.raises(TransferGuardError):
            _dev().sum().item()
    assert active_tracer() is None


def test_the_same_guard_object_can_be_reentered(prof):
    guard = transfer_guard("disallow")
    with guard:
        with guard:
            with pytest.raises(TransferGuardError):
                _dev().sum().item()
        with pytest.raises(TransferGuardError):
            _dev().sum().item()
    _dev().sum().item()


# ----- decorator -----

def test_decorator_guards_each_call(prof):
    @transfer_guard("disallow")
    def step(t):
        """Docstring kept."""
        return t.sum().item()

    assert step.__name__ == "step" and step.__doc__ == "Docstring kept."
    with pytest.raises(TransferGuardError):
        step(_dev())
    _dev().sum().item()  # outside the call: allowed


def test_decorator_recursion_and_standalone():
    calls = []

    @transfer_guard("disallow", device="sim")
    def f(n):
        calls.append(active_tracer())
        if n:
            return f(n - 1)
        return torch.ones(2).cuda().cpu()

    assert f(2).shape == (2,)
    assert calls[0] is not None and all(c is calls[0] for c in calls)
    assert active_tracer() is None


# ----- its own tracer, or the running one -----

def test_standalone_starts_and_stops_its_own_tracer():
    assert active_tracer() is None
    with transfer_guard("disallow", device="sim"):
        tracer = active_tracer()
        assert tracer is not None and tracer.device == "sim"
        assert torch.cuda.is_available()  # the block runs on the simulated GPU
        d = torch.ones(3).cuda()
        assert d.is_cuda
    assert active_tracer() is None
    assert tracer.trace is not None


def test_standalone_auto_device():
    expected = "cuda" if torch.cuda.is_available() else "sim"
    with transfer_guard("disallow"):
        tracer = active_tracer()
        assert tracer.device == expected
        with pytest.raises(TransferGuardError):
            torch.ones(2, device="cuda").sum().item()
    assert active_tracer() is None


def test_standalone_stops_its_tracer_on_a_refused_copy():
    with pytest.raises(TransferGuardError) as e:
        with transfer_guard("disallow", device="sim"):
            line = next_line()
            torch.ones(2, device="cuda").sum().item()
    assert last_user_frame(e) == (HERE, line)
    assert active_tracer() is None


def test_standalone_stops_its_tracer_on_any_error():
    with pytest.raises(KeyError):
        with transfer_guard("log", device="sim"):
            raise KeyError("boom")
    assert active_tracer() is None


def test_inside_a_profiler_the_guard_leaves_the_tracer_running(prof):
    with transfer_guard("disallow_explicit"):
        assert active_tracer() is prof.tracer
    assert active_tracer() is prof.tracer
    with transfer_guard("disallow"), pytest.raises(ZeroDivisionError):
        1 / 0
    assert active_tracer() is prof.tracer
    assert prof.tracer._state.events.listeners == []  # every listener removed


def test_a_profiler_cannot_open_inside_a_standalone_guard():
    with transfer_guard("allow", device="sim"):
        with pytest.raises(RuntimeError, match="already running"):
            with memcpy_doctor.profiler(device="sim"):
                pass
    assert active_tracer() is None


def test_inside_device_guard_without_a_tracer_the_start_error_leaves_nothing():
    with memcpy_doctor.device_guard("cpu"):
        with pytest.raises(RuntimeError, match="outside device_guard"):
            with transfer_guard("disallow", device="sim"):
                pass
    assert active_tracer() is None
    with transfer_guard("allow", device="sim"):
        _dev().sum().item()


def test_guards_are_per_thread(prof):
    """A guard opened in another thread does not judge the traced thread's copies."""
    opened, release = threading.Event(), threading.Event()

    def other():
        with transfer_guard("disallow_explicit"):
            opened.set()
            release.wait(10)

    t = threading.Thread(target=other)
    t.start()
    try:
        assert opened.wait(10)
        _dev().sum().item()
        torch.ones(2).cuda()
    finally:
        release.set()
        t.join()
    assert prof.tracer._state.events.listeners == []


# ----- the real GPU -----

@pytest.mark.cuda
def test_real_gpu_standalone_and_in_profiler():
    with transfer_guard("disallow", device="cuda"):
        assert active_tracer().device == "cuda"
        d = torch.ones(4).cuda()
        d.cpu()
        with pytest.raises(TransferGuardError) as e:
            line = next_line()
            d.sum().item()
        assert last_user_frame(e) == (HERE, line)
        with pytest.raises(TransferGuardError):
            print(d)
        with pytest.raises(TransferGuardError):
            d[d > 1]
    assert active_tracer() is None
    with memcpy_doctor.profiler(device="cuda"):
        with transfer_guard("disallow_explicit"), pytest.raises(TransferGuardError):
            torch.ones(2).to("cuda")


def test_both_devices(device):
    with transfer_guard({"HtoD": "allow", "DtoH": "disallow"}, device=device):
        d = torch.ones(3).to("cuda")
        assert d.cpu().tolist() == [1.0, 1.0, 1.0]
        with pytest.raises(TransferGuardError) as e:
            d.tolist()
        assert e.value.event.trigger == "tolist"
    assert active_tracer() is None
