"""The two PyTorch modes the tracer runs under.

The function mode sees Python-level calls (`t.item()`, `print(t)`, `.to("cuda")`): it names
the trigger of the copies they cause and, on the simulated GPU, answers device questions and
performs transfers. The dispatch mode sees every aten op, forward and backward, and hands it
to `TraceState.dispatch`. While either is busy with the tracer's own work, torch function
handling is off, so the tracer never traces itself.
"""

from __future__ import annotations

from time import perf_counter_ns
from typing import Any, Callable

import torch

from .._torch_private import (TorchDispatchMode, TorchFunctionMode, default_device_type,
                              dynamo_skip_frame, set_eval_frame)
from .optable import DATA_FACTORIES, TRIGGERS
from .sim import printed_bytes
from .state import TraceState

_DisableTorchFunction = torch._C.DisableTorchFunction


class DispatchMode(TorchDispatchMode):
    """Hands every aten op to `TraceState.dispatch`.

    torch wraps a dispatch mode's `__torch_dispatch__` in torch._dynamo.disable, a Python
    wrapper that costs about a microsecond an op; this mode opts out of the wrapper and does
    what it does, directly: torch.compile never compiles `__torch_dispatch__` itself (its
    code is marked skipped) and no eval-frame callback runs while the tracer's own code runs
    (the caller's is restored after).
    """

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        return False  # read once, by TorchDispatchMode.__init_subclass__

    def __init__(self, state: TraceState) -> None:
        super().__init__()
        self.state = state
        dynamo_skip_frame(DispatchMode.__torch_dispatch__.__code__)

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (),
                           kwargs: dict | None = None) -> Any:
        prior = set_eval_frame(None)
        try:
            state = self.state
            if state.suspended:
                return func(*args, **(kwargs or {}))
            with _DisableTorchFunction():
                return state.dispatch(func, args, kwargs or {})
        finally:
            set_eval_frame(prior)


#: What the function mode does with a Python-level call, decided once per callable.
_PLAIN, _HANDLED, _TRIGGER, _DATA_FACTORY, _GETTER = range(5)


class FunctionMode(TorchFunctionMode):
    def __init__(self, state: TraceState, handlers: dict[Any, Callable]) -> None:
        super().__init__()
        self.state = state
        self.handlers = handlers
        sim = state.sim
        self.factory = sim.factory if sim is not None else None
        self.kinds: dict[Any, int] = {}

    def _kind(self, func: Any) -> int:
        if func in self.handlers:
            kind = _HANDLED
        elif func in DATA_FACTORIES:
            kind = _DATA_FACTORY
        elif func in TRIGGERS:
            kind = _TRIGGER
        elif getattr(func, "__name__", None) == "__get__":
            kind = _GETTER
        else:
            kind = _PLAIN
        try:
            self.kinds[func] = kind
        except TypeError:  # an unhashable callable: decided again next time
            pass
        return kind

    def __torch_function__(self, func: Any, types: Any, args: tuple = (),
                           kwargs: dict | None = None) -> Any:
        if kwargs is None:
            kwargs = {}
        state = self.state
        if state.suspended:
            return func(*args, **kwargs)
        try:
            kind = self.kinds.get(func)
        except TypeError:
            kind = None
        if kind is None:
            kind = self._kind(func)
        if kind == _GETTER:  # t.shape, t.dtype, ...: the commonest call, and never a copy
            return func(*args, **kwargs)
        if kind == _HANDLED:
            return self.handlers[func](func, args, kwargs)
        trigger = TRIGGERS.get(func) if kind != _PLAIN else None
        if self.factory is None:  # real GPU: only name the trigger
            if trigger is None:
                return func(*args, **kwargs)
            prev = state.trigger
            state.trigger = trigger
            try:
                return func(*args, **kwargs)
            finally:
                state.trigger = prev
        # simulated GPU
        if kwargs and ("device" in kwargs or kwargs.get("pin_memory")):
            return self.factory(func, args, kwargs)
        if kind == _DATA_FACTORY and default_device_type() == "cuda":
            # under torch.set_default_device("cuda") torch would build these on the device
            return self.factory(func, args, {**kwargs, "device": torch.device("cuda", 0)})
        prev, prev_call = state.trigger, state.call_args
        if trigger is not None:
            state.trigger = trigger
        state.call_args = (args, kwargs)  # read only if an op inside has no tensor inputs
        try:
            return func(*args, **kwargs)
        finally:
            state.trigger, state.call_args = prev, prev_call


def common_handlers(state: TraceState) -> dict[Any, Callable]:
    """Handlers both devices need."""

    def set_data(func: Any, args: tuple, kwargs: dict) -> Any:
        result = func(*args, **kwargs)
        if len(args) == 2 and isinstance(args[1], torch.Tensor):
            state.collector.rebind(args[1], args[0])
        return result

    return {torch.Tensor.data.__set__: set_data}


def real_gpu_handlers(state: TraceState) -> dict[Any, Callable]:
    """On a real GPU, print() formats under torch's own `_disable_current_modes`, so the
    dispatch mode cannot see its copies; the function mode records them instead."""

    def read_back(func: Any, args: tuple, kwargs: dict) -> Any:
        t = args[0]
        if not t.is_cuda or (func is torch.Tensor.__format__ and t.dim() == 0):
            prev = state.trigger
            state.trigger = "format" if func is torch.Tensor.__format__ else prev
            try:
                return func(*args, **kwargs)
            finally:
                state.trigger = prev
        site = state.sites.resolve()
        t0 = perf_counter_ns()
        result = func(*args, **kwargs)
        state.sync_copy("DtoH", "print", printed_bytes(t), t, site, perf_counter_ns() - t0)
        state.returned()
        return result

    return {**common_handlers(state), torch.Tensor.__repr__: read_back,
            torch.Tensor.__format__: read_back}
