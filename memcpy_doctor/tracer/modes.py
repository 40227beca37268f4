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

from .._torch_private import TorchDispatchMode, TorchFunctionMode, default_device_type
from .optable import DATA_FACTORIES, TRIGGERS
from .sim import printed_bytes
from .state import TraceState

_DisableTorchFunction = torch._C.DisableTorchFunction


class DispatchMode(TorchDispatchMode):
    def __init__(self, state: TraceState) -> None:
        super().__init__()
        self.state = state

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (),
                           kwargs: dict | None = None) -> Any:
        state = self.state
        if state.suspended:
            return func(*args, **(kwargs or {}))
        with _DisableTorchFunction():
            return state.dispatch(func, args, kwargs or {})


class FunctionMode(TorchFunctionMode):
    def __init__(self, state: TraceState, handlers: dict[Any, Callable]) -> None:
        super().__init__()
        self.state = state
        self.handlers = handlers
        sim = state.sim
        self.factory = sim.factory if sim is not None else None

    def __torch_function__(self, func: Any, types: Any, args: tuple = (),
                           kwargs: dict | None = None) -> Any:
        if kwargs is None:
            kwargs = {}
        state = self.state
        if state.suspended:
            return func(*args, **kwargs)
        handler = self.handlers.get(func)
        if handler is not None:
            return handler(func, args, kwargs)
        trigger = TRIGGERS.get(func)
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
        if "device" in kwargs or kwargs.get("pin_memory"):
            return self.factory(func, args, kwargs)
        if func in DATA_FACTORIES and default_device_type() == "cuda":
            # under torch.set_default_device("cuda") torch would build these on the device
            return self.factory(func, args, {**kwargs, "device": torch.device("cuda", 0)})
        if getattr(func, "__name__", None) == "__get__":
            return func(*args, **kwargs)
        prev, prev_call = state.trigger, state.call_args
        state.trigger = trigger or prev
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
