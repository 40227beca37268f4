"""The simulated GPU for a whole session, with nothing recorded (the pytest plugin's
`--memcpy-doctor-device sim`).

A tracer's simulated GPU exists only while the tracer runs; a test suite, though, asks
`torch.cuda.is_available()` when it imports its modules, long before any test body runs.
`SessionSim` puts the simulated GPU in place for as long as it is entered: torch.cuda answers
as one GPU, and two light modes keep device marks on storages (sim/marks.py), answer device
questions and turn `.to("cuda")` and `device="cuda"` factories into host work plus marks. They
record nothing: the dispatch mode runs the tracer's own per-op path (tracer/perop.py) with its
recording steps off (no op aggregates, no call sites, no modeled time, which cost
accordingly). Copies, which are rare, go through the simulated device's own transfer code,
into a scratch record that nobody reads.

A tracer started while a SessionSim is entered (the plugin's per-test tracer, or a user's
`memcpy_doctor.profiler()`) takes over: the session's modes come off torch's mode stacks and
its patches are undone while the tracer runs, and the tracer's own simulated device shares
the session's marks, so tensors made before it (at import, in fixtures) are still on the
device. The session's simulated GPU comes back when the tracer stops.
"""

from __future__ import annotations

import threading
import types
from contextlib import ExitStack, contextmanager
from typing import Any, Callable, Iterator

import torch

from ...core.costmodel import load_profile
from ...core.torch_private import TorchFunctionMode, default_device_type
from ..context import RunRecords, ThreadContext
from ..patches import Patch, start_under
from ..optable import DATA_FACTORIES, METADATA_CALLS
from ..modes import DispatchMode
from ..tensors import NO_KWARGS
from . import marks as _marks
from . import streams as _streams
from .autocast import cuda_autocast
from .device import SimDevice
from .torchlib import serialization, torch_patches


#: The SessionSim now entered in this process, if any (at most one).
_ENTERED: list[SessionSim] = []


def session_sim() -> SessionSim | None:
    """The session-wide simulated GPU now in place in this process, if any."""
    return _ENTERED[0] if _ENTERED else None


class SessionSim:
    """One simulated GPU kept in place from `enter()` to `exit()`, recording nothing."""

    def __init__(self, profile: Any = None) -> None:
        self.profile = load_profile(profile)
        self.sim = SimDevice(lambda s: RunRecords(self.profile, s, None).context())
        self._patches: ExitStack | None = None
        #: this thread's modes (function, dispatch), while they are on torch's stacks
        self._modes: tuple[Any, Any] | None = None
        self._depth: tuple[int, int] | None = None  # where they were, while paused

    # ----- in and out -----
    def enter(self) -> SessionSim:
        """Put the simulated GPU in place in this process (the calling thread's torch modes,
        and threads started from now on)."""
        if _ENTERED:
            raise RuntimeError("a session-wide simulated GPU is already in place")
        _ENTERED.append(self)
        try:
            self._apply()
            self._modes = self._push_modes(self.sim.main_state)
        except BaseException:
            self.exit()
            raise
        return self

    def exit(self) -> None:
        """Undo everything `enter` did (also after a partial enter, and while paused)."""
        if self._modes is not None:
            function, dispatch = self._modes
            self._modes = None
            for mode, stack in ((dispatch, _DISPATCH), (function, _FUNCTION)):
                if self._depth is not None or _lift(stack, mode) is not None:
                    stack.push(mode)  # on top, to leave as torch's own exit leaves a mode
                    mode.__exit__(None, None, None)
            self._depth = None
        self._undo()
        if self in _ENTERED:
            _ENTERED.remove(self)

    @contextmanager
    def paused(self) -> Iterator[SimDevice]:
        """Take the session's simulated GPU out (modes and patches) until the block ends,
        for a tracer that brings its own; yields the device whose marks it should share."""
        if self._modes is None or self._depth is not None:
            raise RuntimeError("the session-wide simulated GPU is not in place")
        function, dispatch = self._modes
        marks = self.sim.cuda_marks
        # the tracer's run reports its own peak (read after this block ends): a profiled
        # run resets the session's peak, as torch.cuda.reset_peak_memory_stats() would
        marks.peak = marks.allocated
        self._depth = (_lift(_FUNCTION, function), _lift(_DISPATCH, dispatch))
        self._undo()
        try:
            yield self.sim
        finally:
            if self._modes is not None:  # (not exited meanwhile)
                self._resume(function, dispatch)

    def _resume(self, function: Any, dispatch: Any) -> None:
        at_function, at_dispatch = self._depth
        self._depth = None
        self._apply()
        _insert(_FUNCTION, function, at_function)
        _insert(_DISPATCH, dispatch, at_dispatch)

    def resolve(self, device: str) -> str:
        """The device a tracer started now runs on: the simulated one, whatever it asks
        for ('cuda' cannot be told from the simulated GPU here, so it is refused)."""
        if device == "cuda":
            raise RuntimeError("device cuda: the simulated GPU is in place for this whole "
                               "session (--memcpy-doctor-device sim); use device 'sim' or "
                               "'auto'")
        return "sim"

    def share_marks(self, sim: SimDevice) -> None:
        """Have a tracer's simulated device see the session's device tensors as its own."""
        sim.cuda_marks, sim.pinned_marks = self.sim.cuda_marks, self.sim.pinned_marks

    # ----- patches -----
    def _apply(self) -> None:
        sim, stack = self.sim, ExitStack()
        self._patches = stack
        _streams._ACTIVE["sim"] = sim
        stack.callback(_streams._ACTIVE.clear)
        autocast = stack.enter_context(cuda_autocast(sim))
        stack.enter_context(Patch(
            [(torch.cuda, k, v) for k, v in _marks.cuda_patches(sim, self.profile).items()]
            + [(torch.accelerator, k, v) for k, v in _marks.accelerator_patches(sim).items()]
            + [_marks.pin_memory_patch(sim)] + _marks.memory_stats_patches(sim)
            + torch_patches(sim) + autocast
            + [(threading.Thread, "start", start_under(self.thread_modes))]))
        stack.enter_context(serialization(sim))

    def _undo(self) -> None:
        stack, self._patches = self._patches, None
        if stack is not None:
            stack.close()

    @contextmanager
    def thread_modes(self, name: str) -> Iterator[None]:
        """Run the calling thread (one started while the session's GPU is in place) on it."""
        sim = self.sim
        state = sim.main_state.run.context(name)
        ident = threading.get_ident()
        sim.thread_states[ident] = state
        function, dispatch = _modes(sim, state)
        try:
            with function, dispatch:
                yield
        finally:
            sim.thread_states.pop(ident, None)

    def _push_modes(self, state: ThreadContext) -> tuple[Any, Any]:
        function, dispatch = _modes(self.sim, state)
        function.__enter__()
        try:
            dispatch.__enter__()
        except BaseException:
            function.__exit__(None, None, None)
            raise
        return function, dispatch


# ----- the light modes -----

_HANDLED, _DATA_FACTORY, _GETTER, _OTHER = range(4)


class _FunctionMode(TorchFunctionMode):
    """Device questions, transfers and `device=` factories, as the simulated device answers
    them; every other call runs as it is, its arguments kept for the ops inside it (an op
    with no tensor inputs in a call over device tensors is on the device)."""

    def __init__(self, sim: SimDevice, state: ThreadContext) -> None:
        super().__init__()
        handlers, factory, kinds = sim.handlers, sim.factory, {}

        def kind_of(func: Any) -> int:
            if func in handlers:
                kind = _HANDLED
            elif func in DATA_FACTORIES:
                kind = _DATA_FACTORY
            elif getattr(func, "__name__", None) == "__get__" or func in METADATA_CALLS:
                kind = _GETTER
            else:
                kind = _OTHER
            kinds[func] = kind
            return kind

        def __torch_function__(mode: Any, func: Any, types: Any, args: tuple = (),
                               kwargs: dict | None = None) -> Any:
            if kwargs is None:
                kwargs = NO_KWARGS
            if state.suspended:
                return func(*args, **kwargs)
            try:
                kind = kinds.get(func)
                if kind is None:
                    kind = kind_of(func)
            except TypeError:  # an unhashable callable
                kind = _OTHER
            if kind == _GETTER:
                return func(*args, **kwargs)
            if kind == _HANDLED:
                return handlers[func](func, args, kwargs)
            if kwargs and ("device" in kwargs or kwargs.get("pin_memory")):
                return factory(func, args, kwargs)
            if kind == _DATA_FACTORY and default_device_type() == "cuda":
                return factory(func, args, {**kwargs, "device": torch.device("cuda", 0)})
            prev, state.call_args = state.call_args, (args, kwargs)
            try:
                return func(*args, **kwargs)
            finally:
                state.call_args = prev

        self.__torch_function__ = types.MethodType(__torch_function__, self)

    def __torch_function__(self, func: Any, types: Any, args: tuple = (),
                           kwargs: dict | None = None) -> Any:
        raise AssertionError("replaced on each instance")


class _DispatchMode(DispatchMode):
    """The tracer's dispatch mode (the one per-op path, tracer/perop.py) with its recording
    steps off: device marks from inputs to outputs, the error a GPU raises for mixed devices,
    copies made by torch's C++ code. Unlike the tracer's, it leaves torch.compile's internals
    under the mode, as the session's GPU always has."""

    @classmethod
    def ignore_compile_internals(cls) -> bool:
        return False

    def __init__(self, state: ThreadContext) -> None:
        super().__init__(state, records=False)


def _modes(sim: SimDevice, state: ThreadContext) -> tuple[Any, Any]:
    return _FunctionMode(sim, state), _DispatchMode(state)


# ----- torch's mode stacks: a mode taken out from under others, and put back -----

class _Stack:
    def __init__(self, length: Callable, pop: Callable, push: Callable) -> None:
        self.length, self.pop, self.push = length, pop, push


_FUNCTION = _Stack(torch._C._len_torch_function_stack, torch._C._pop_torch_function_stack,
                   torch._C._push_on_torch_function_stack)
_DISPATCH = _Stack(torch._C._len_torch_dispatch_stack,
                   lambda: torch._C._pop_torch_dispatch_stack(None),
                   torch._C._push_on_torch_dispatch_stack)


def _lift(stack: _Stack, mode: Any) -> int | None:
    """Take `mode` off `stack`, the modes above it kept in order; where it was (its index
    from the bottom), or None when it is not on the stack."""
    above: list[Any] = []
    found = False
    while stack.length():
        top = stack.pop()
        if top is mode:
            found = True
            break
        above.append(top)
    at = stack.length()
    for other in reversed(above):
        stack.push(other)
    return at if found else None


def _insert(stack: _Stack, mode: Any, at: int | None) -> None:
    """Put `mode` back at index `at` (on top if the stack is lower now, or if None)."""
    above = []
    while at is not None and stack.length() > at:
        above.append(stack.pop())
    stack.push(mode)
    for other in reversed(above):
        stack.push(other)
