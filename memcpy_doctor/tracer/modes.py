"""The two PyTorch modes the tracer runs under.

The function mode sees Python-level calls (`t.item()`, `print(t)`, `.to("cuda")`): it names
the trigger of the copies they cause and, on the simulated GPU, answers device questions and
performs transfers. The dispatch mode sees every aten op, forward and backward, and hands it
to the per-op path (tracer/perop.py). While either is busy with the tracer's own work, torch
function handling is off, so the tracer never traces itself.
"""

from __future__ import annotations

import sys
import types
from time import perf_counter_ns
from typing import Any, Callable

import torch
from torch.compiler import is_dynamo_compiling

from ..core.torch_private import (TorchDispatchMode, TorchFunctionMode, default_device_type,
                                  dynamo_skip_frame, set_eval_frame)
from .backward import arm
from .optable import DATA_FACTORIES, METADATA_CALLS, TRIGGERS
from .sim.marks import printed_bytes
from .context import UNRESOLVED, ThreadContext
from .cuda import factory_handler, run_recorded
from .perop import dispatcher
from .sites import UNSET
from .tensors import NO_KWARGS


class DispatchMode(TorchDispatchMode):
    """Hands every aten op to its thread's per-op path (perop.dispatcher), which torch calls
    as this mode's `__torch_dispatch__`: torch looks the method up on the mode object (and
    checks that it is bound to it), so the closure, bound to the instance, is called with no
    Python frame in between.

    torch wraps a dispatch mode's `__torch_dispatch__` in torch._dynamo.disable, a Python
    wrapper that costs about a microsecond an op; this mode opts out of the wrapper and the
    dispatcher does what it does, directly (torch.compile never compiles its code, marked
    skipped here).
    """

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        return False  # read once, by TorchDispatchMode.__init_subclass__

    @classmethod
    def ignore_compile_internals(cls) -> bool:
        return True

    def __init__(self, state: ThreadContext, records: bool = True) -> None:
        super().__init__()
        self.state = state
        dispatch = dispatcher(state, records)
        self.__torch_dispatch__ = types.MethodType(dispatch, self)
        dynamo_skip_frame(dispatch.__code__)

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (),
                           kwargs: dict | None = None) -> Any:
        raise AssertionError("replaced on each instance by its thread's dispatcher")


#: Python-level calls that read a host tensor's data with no aten op (the race checker's).
HOST_READ_CALLS = {torch.Tensor.tolist: "tolist", torch.Tensor.numpy: "numpy",
                   torch.Tensor.__array__: "numpy", torch.Tensor.__repr__: "print",
                   torch.Tensor.__format__: "format"}

#: What the function mode does with a Python-level call, decided once per callable.
#: _BUILTIN is a plain call into C++ (torch.mm, Tensor.add): no Python runs inside it, so
#: every op it dispatches has the call site of the call, found once here rather than by a
#: stack walk per op. A call into Python code (_PLAIN) may reach the user's code again
#: (a hook, a custom autograd Function), so its ops walk the stack, up to the call's frame in
#: `_plain`, a boundary whose site is found once per call (see tracer/sites.py).
_PLAIN, _BUILTIN, _HANDLED, _TRIGGER, _DATA_FACTORY, _GETTER = range(6)
_C_CALLABLES = (types.BuiltinFunctionType, types.MethodDescriptorType,
                types.WrapperDescriptorType, types.MethodWrapperType)
_getframe = sys._getframe


class FunctionMode(TorchFunctionMode):
    """Sees Python-level torch calls; its `__torch_function__` is a closure bound to the
    instance (as DispatchMode's is), built by `_handler`."""

    def __init__(self, state: ThreadContext, handlers: dict[Any, Callable]) -> None:
        super().__init__()
        self.state = state
        self.handlers = handlers
        sim = state.sim
        self.factory = sim.factory if sim is not None else None
        self.kinds: dict[Any, int] = {}
        self.calls = state.sites.calls
        state.sites.add_boundary(FunctionMode._plain.__code__)
        handler = self._handler()
        self.__torch_function__ = types.MethodType(handler, self)
        for code in (handler.__code__, FunctionMode._plain.__code__,
                     FunctionMode._kind.__code__, FunctionMode._triggered.__code__):  # run as they are when called, never
            dynamo_skip_frame(code)  # compiled (_kind: before the eval-frame switch)

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

    def _handler(self) -> Callable[..., Any]:
        """The mode's `__torch_function__`, with what stays fixed for the run bound once."""
        state, kinds, handlers, factory = self.state, self.kinds, self.handlers, self.factory
        kind_of, plain, triggered = self._kind, self._plain, self._triggered
        sim = factory is not None
        codes, resolve_from = state.sites.codes, state.sites.resolve_from
        races, inflight = state.run.races, state.run.races.inflight  # (empty: none in flight)

        def __torch_function__(mode: Any, func: Any, types: Any, args: tuple = (),
                               kwargs: dict | None = None) -> Any:
            kwargs = NO_KWARGS if kwargs is None else kwargs
            if state.suspended or is_dynamo_compiling():  # (Dynamo inlines this handler as it
                if sim and not state.suspended:  # traces: the call alone, as without a mode;
                    func, args, kwargs = on_host(func, args, kwargs)  # for the sim's host)
                return func(*args, **kwargs)
            try:
                kind = kinds.get(func)
            except TypeError:
                kind = None
            if kind is None:
                kind = kind_of(func)
            if kind == _GETTER:  # t.shape, t.dtype, ...: the commonest call, never a copy (and
                return func(*args, **kwargs) if kwargs else func(*args)  # none of our code)
            # no eval-frame callback runs the tracer's own code (in a compiled function's
            # graph-break code, Dynamo would compile this handler and those it calls)
            prior = set_eval_frame(None)
            try:
                if inflight and func in HOST_READ_CALLS and args:  # a read no op makes
                    races.read(HOST_READ_CALLS[func], args[0], resolve_from(_getframe(1)),
                               state.thread)
                if kind == _HANDLED:
                    return handlers[func](func, args, kwargs)
                if sim and kwargs and ("device" in kwargs or kwargs.get("pin_memory")):
                    return factory(func, args, kwargs)
                # (the sim reads the call's arguments only for an op inside with no tensor input)
                if kind == _BUILTIN:  # the commonest call: no trigger to name
                    prev_call, prev_site = state.call_args, state.call_site
                    caller = _getframe(1)  # SiteResolver.resolve_from, its first step inlined:
                    entry = codes.get(id(caller.f_code))  # the caller is most often user code
                    site = entry.get(caller.f_lasti) if entry else None
                    state.call_args = (args, kwargs)
                    prev_frame = state.call_frame
                    if site is not None:
                        state.call_site = site
                    else:  # called from torch's code (or a line not seen yet): its first op, if
                        # any, walks from the caller (`p.grad = None`, torch.no_grad() run none)
                        state.call_site, state.call_frame = UNRESOLVED, caller
                    del caller
                    try:  # (without kwargs, the call builds no dict to unpack them into)
                        return func(*args, **kwargs) if kwargs else func(*args)
                    finally:
                        state.call_args, state.call_site = prev_call, prev_site
                        state.call_frame = prev_frame
                if kind == _PLAIN:  # a Python function: its ops find their own sites (and
                    if prior is not None:  # torch.compile's callback sees its frames, as
                        set_eval_frame(prior)  # without the tracer)
                    return plain(func, args, kwargs)
                if sim and kind == _DATA_FACTORY:
                    if default_device_type() == "cuda":
                        # under torch.set_default_device("cuda") torch builds these on the device
                        return factory(func, args, {**kwargs, "device": torch.device("cuda", 0)})
                    state.sim.read_factory_data(func, args, kwargs)
                return triggered(func, args, kwargs, _getframe(1))
            finally:
                if prior is not None:
                    set_eval_frame(prior)
                if state.backward_pending:  # the autograd nodes of its ops exist now
                    arm(state.backward_pending)

        return __torch_function__

    def __torch_function__(self, func: Any, types: Any, args: tuple = (),
                           kwargs: dict | None = None) -> Any:
        raise AssertionError("replaced on each instance by `_handler`")

    def _triggered(self, func: Any, args: tuple, kwargs: dict, caller: Any) -> Any:
        """A call that may copy (`t.item()`, `.to("cuda")`, `backward()`: TRIGGERS names
        its copies) or any other the handler does not take itself, made from `caller`."""
        state, resolve_from = self.state, self.state.sites.resolve_from
        trigger = TRIGGERS.get(func)
        prev, prev_call = state.trigger, state.call_args
        prev_backward, prev_site = state.backward_site, state.call_site
        if trigger is not None:
            state.trigger = trigger
            if trigger == "backward":
                state.backward_site = resolve_from(caller)
            elif isinstance(func, _C_CALLABLES):  # t.item(), torch.tensor(): as _BUILTIN
                state.call_site = resolve_from(caller)
        del caller
        state.call_args = (args, kwargs)
        try:
            return func(*args, **kwargs)
        finally:
            state.trigger, state.call_args = prev, prev_call
            state.backward_site, state.call_site = prev_backward, prev_site

    def _plain(self, func: Any, args: tuple, kwargs: dict) -> Any:
        """A call into a torch function written in Python; its frame is a boundary (see
        tracer/sites.py) while it runs."""
        state, calls = self.state, self.calls
        calls.append([_getframe(0), UNSET])
        prev_call = state.call_args
        if self.factory is not None:
            state.call_args = (args, kwargs)
        try:
            return func(*args, **kwargs)
        finally:
            state.call_args = prev_call
            calls.pop()


def _is_cuda(device: Any) -> bool:
    return (isinstance(device, str) and device.startswith("cuda")) or (
        isinstance(device, torch.device) and device.type == "cuda")


def on_host(func: Any, args: tuple, kwargs: dict) -> tuple[Any, tuple, dict]:
    """A call's arguments with each device it names that is cuda made the host, for Dynamo
    tracing a compiled function on the simulated GPU: the graph is compiled for the host the
    simulated device's tensors live on (Inductor builds CPU code), and a literal
    `device="cuda"` or `.to("cuda")` inside it would otherwise mix devices there. (The copies
    such a graph makes between devices are not simulated: compiled.py notes them.)"""
    if func is torch.Tensor.cuda:
        return torch.Tensor.to, (args[0], "cpu"), {}
    if "device" in kwargs and _is_cuda(kwargs["device"]):
        kwargs = {**kwargs, "device": "cpu"}
    if func is torch.Tensor.to and any(_is_cuda(a) for a in args[1:]):
        args = tuple("cpu" if _is_cuda(a) else a for a in args)
    return func, args, kwargs


def common_handlers(state: ThreadContext) -> dict[Any, Callable]:
    """Handlers both devices need."""

    def set_data(func: Any, args: tuple, kwargs: dict) -> Any:
        result = func(*args, **kwargs)
        if len(args) == 2 and isinstance(args[1], torch.Tensor):
            state.collector.rebind(args[1], args[0])
        return result

    return {torch.Tensor.data.__set__: set_data}


def real_gpu_handlers(state: ThreadContext) -> dict[Any, Callable]:
    """On a real GPU, print() formats under torch's own `_disable_current_modes`, and the
    data factories copy under a guard that excludes Python dispatch, so the dispatch mode
    cannot see their copies; the function mode records them instead."""

    def read_back(func: Any, args: tuple, kwargs: dict) -> Any:
        t = args[0]
        if not t.is_cuda or (func is torch.Tensor.__format__ and t.dim() == 0):
            prev = state.trigger
            state.trigger = "format" if func is torch.Tensor.__format__ else prev
            try:
                return func(*args, **kwargs)
            finally:
                state.trigger = prev
        site = state.here()
        t0 = perf_counter_ns()
        result = run_recorded(state, func, args, kwargs)
        state.sync_copy("DtoH", "print", printed_bytes(t), t, site, perf_counter_ns() - t0)
        return result

    factory = factory_handler(state)
    return {**common_handlers(state), torch.Tensor.__repr__: read_back,
            torch.Tensor.__format__: read_back, **{f: factory for f in DATA_FACTORIES}}
