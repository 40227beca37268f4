"""The two PyTorch modes the tracer runs under.

The function mode sees Python-level calls (`t.item()`, `print(t)`, `.to("cuda")`): it names
the trigger of the copies they cause and, on the simulated GPU, answers device questions and
performs transfers. The dispatch mode sees every aten op, forward and backward, and hands it
to `TraceState.dispatch`. While either is busy with the tracer's own work, torch function
handling is off, so the tracer never traces itself.
"""

from __future__ import annotations

import sys
import types
from time import perf_counter_ns
from typing import Any, Callable

import torch

from .._torch_private import (TorchDispatchMode, TorchFunctionMode, default_device_type,
                              dynamo_skip_frame, set_eval_frame)
from .optable import DATA_FACTORIES, METADATA_CALLS, TRIGGERS
from .sim import printed_bytes
from .state import TraceState

_DisableTorchFunction = torch._C.DisableTorchFunction
#: Whether a torch function mode is on the stack or an argument is a tensor subclass with its
#: own __torch_function__. Usually neither is so while an op is dispatched (the function mode
#: is off while the call it handles runs), and entering DisableTorchFunction costs a fifth of
#: a microsecond an op.
_has_torch_function = torch._C._has_torch_function


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
                return func(*args, **(kwargs if kwargs is not None else _NO_KWARGS))
            if kwargs is None:
                kwargs = _NO_KWARGS
            if _has_torch_function(args):  # the tracer's own tensor reads must not reach
                with _DisableTorchFunction():  # a function mode or a subclass's handler
                    return state.dispatch(func, args, kwargs)
            return state.dispatch(func, args, kwargs)
        finally:
            set_eval_frame(prior)


#: What the function mode does with a Python-level call, decided once per callable.
#: _BUILTIN is a plain call into C++ (torch.mm, Tensor.add): no Python runs inside it, so
#: every op it dispatches has the call site of the call, found once here rather than by a
#: stack walk per op. A call into Python code (_PLAIN) may reach the user's code again
#: (a hook, a custom autograd Function), so its ops walk the stack.
_PLAIN, _BUILTIN, _HANDLED, _TRIGGER, _DATA_FACTORY, _GETTER = range(6)
_C_CALLABLES = (types.BuiltinFunctionType, types.MethodDescriptorType,
                types.WrapperDescriptorType, types.MethodWrapperType)
_getframe = sys._getframe
#: The kwargs of a call without any, shared by all such calls (neither torch nor the tracer
#: changes a kwargs dict in place; a read-only mapping would cost 0.14 us each time it is
#: unpacked).
_NO_KWARGS: dict = {}


class FunctionMode(TorchFunctionMode):
    def __init__(self, state: TraceState, handlers: dict[Any, Callable]) -> None:
        super().__init__()
        self.state = state
        self.handlers = handlers
        sim = state.sim
        self.factory = sim.factory if sim is not None else None
        self.kinds: dict[Any, int] = {}
        self.codes = state.sites.codes

    def _kind(self, func: Any) -> int:
        if func in self.handlers:
            kind = _HANDLED
        elif func in DATA_FACTORIES:
            kind = _DATA_FACTORY
        elif func in TRIGGERS:
            kind = _TRIGGER
        elif getattr(func, "__name__", None) == "__get__" or func in METADATA_CALLS:
            kind = _GETTER
        elif isinstance(func, _C_CALLABLES):
            kind = _BUILTIN
        else:
            kind = _PLAIN
        try:
            self.kinds[func] = kind
        except TypeError:  # an unhashable callable: decided again next time
            pass
        return kind

    def __torch_function__(self, func: Any, types: Any, args: tuple = (),
                           kwargs: dict | None = None) -> Any:
        state = self.state
        if kwargs is None:
            kwargs = _NO_KWARGS
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
        sim = self.factory is not None
        if sim and kwargs and ("device" in kwargs or kwargs.get("pin_memory")):
            return self.factory(func, args, kwargs)
        # the arguments of the call now running are read (on the simulated GPU) only if an
        # op inside it has no tensor inputs
        if kind == _BUILTIN:  # the commonest call: no trigger to name
            prev_call, prev_site = state.call_args, state.call_site
            caller = _getframe(1)  # SiteResolver.resolve_from, its first step inlined:
            entry = self.codes.get(id(caller.f_code))  # the caller is most often user code
            site = entry.get(caller.f_lasti) if entry else None
            state.call_site = site if site is not None else state.sites.resolve_from(caller)
            del caller
            state.call_args = (args, kwargs)
            try:
                return func(*args, **kwargs)
            finally:
                state.call_args, state.call_site = prev_call, prev_site
        if kind == _PLAIN:  # a Python function: its ops find their own sites
            if not sim:
                return func(*args, **kwargs)
            prev_call = state.call_args
            state.call_args = (args, kwargs)
            try:
                return func(*args, **kwargs)
            finally:
                state.call_args = prev_call
        if sim and kind == _DATA_FACTORY and default_device_type() == "cuda":
            # under torch.set_default_device("cuda") torch would build these on the device
            return self.factory(func, args, {**kwargs, "device": torch.device("cuda", 0)})
        trigger = TRIGGERS.get(func)
        prev, prev_call = state.trigger, state.call_args
        prev_backward, prev_site = state.backward_site, state.call_site
        if trigger is not None:
            state.trigger = trigger
            if trigger == "backward":
                state.backward_site = state.sites.resolve_from(_getframe(1))
            elif isinstance(func, _C_CALLABLES):  # t.item(), torch.tensor(...): as _BUILTIN
                state.call_site = state.sites.resolve_from(_getframe(1))
        state.call_args = (args, kwargs)
        try:
            return func(*args, **kwargs)
        finally:
            state.trigger, state.call_args = prev, prev_call
            state.backward_site, state.call_site = prev_backward, prev_site


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
