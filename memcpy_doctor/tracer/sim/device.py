"""The simulated GPU's answers to Python-level torch calls (see marks.py for the idea).

Each handler takes (func, args, kwargs) from the function mode and does what a real GPU would:
`.to("cuda")` copies into a fresh storage marked cuda and records the copy with its modeled
time; factories with `device="cuda"` build on the host and mark the result; device queries
answer from the marks.
"""

from __future__ import annotations

import warnings
from threading import get_ident
from typing import Any, Callable

import torch

from ...core.defaults import SYNC_DEBUG_WARNING
from ...core.torch_private import TorchFunctionMode, _disable_current_modes, _parse_to
from ..optable import DATA_FACTORIES
from .marks import CPU, CUDA0, StorageMarks, normalize_device, printed_bytes
from .torchlib import (ctc_loss_handler, host_factory_handler, host_outputs_handler,
                       one_hot_handler, tensors_in_data)
from ..context import ThreadContext
from ..tensors import storage_of, tensors_in, tensors_out

Tensor = torch.Tensor


def _call(func: Any, args: tuple, kwargs: dict) -> Any:
    return func(*args, **kwargs)


def _with_data(func: Any, args: tuple, kwargs: dict, data: Tensor) -> tuple[tuple, dict]:
    """A data factory's arguments with its data replaced (positional or keyword)."""
    first = 1 if func is Tensor.new_tensor else 0
    if len(args) > first:
        return args[:first] + (data,) + args[first + 1:], kwargs
    key = "obj" if "obj" in kwargs else "data"
    return args, {**kwargs, key: data}


class _SimTransfer(torch.autograd.Function):
    """A copy between host and simulated device that autograd can run backwards: the
    gradient makes the opposite copy, recorded like any other."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, sim: SimDevice, to_cuda: bool, dtype: Any,
                memory_format: Any) -> Tensor:
        ctx.sim = sim
        ctx.src_cuda = not to_cuda
        ctx.src_dtype = x.dtype
        return sim.raw_copy(x, dtype, memory_format)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple:
        with torch._C.DisableTorchFunction():
            back = ctx.sim.transfer(grad, CUDA0 if ctx.src_cuda else CPU, ctx.src_dtype,
                                    False, False, None, "backward")
        return back, None, None, None, None


class _AnswerDevice(TorchFunctionMode):
    """Answers device queries from the marks while torch formats a tensor for print()."""

    def __init__(self, sim: SimDevice) -> None:
        super().__init__()
        self.getters = sim.getters

    def __torch_function__(self, func: Any, types: Any, args: tuple = (),
                           kwargs: dict | None = None) -> Any:
        getter = self.getters.get(func)
        if getter is not None:
            return getter(func, args, kwargs or {})
        return func(*args, **(kwargs or {}))


class SimDevice:
    """One simulated CUDA device (cuda:0) for one tracer run."""

    def __init__(self, state_factory: Callable[[SimDevice], ThreadContext]) -> None:
        self.cuda_marks = StorageMarks()
        self.pinned_marks = StorageMarks()
        #: torch.cuda.set_sync_debug_mode's level on this device: 0 default, 1 warn, 2 error
        self.sync_debug = 0
        self.main_state = state_factory(self)
        self.main_ident = get_ident()  # (made by Tracer.start, in the tracing thread)
        #: the contexts of other traced threads, by thread ident (see Tracer.thread_modes)
        self.thread_states: dict[int, ThreadContext] = {}
        self.getters: dict[Any, Callable] = {
            Tensor.device.__get__: self._device,
            Tensor.is_cuda.__get__: self._is_cuda,
            Tensor.is_cpu.__get__: self._is_cpu,
            Tensor.get_device: self._get_device,
        }
        self.handlers: dict[Any, Callable] = {
            **self.getters,
            Tensor.to: self._to,
            Tensor.cuda: self._cuda,
            Tensor.cpu: self._cpu,
            Tensor.copy_: self._copy_,
            Tensor.pin_memory: self._pin_memory,
            Tensor.is_pinned: self._is_pinned,
            Tensor.numpy: self._numpy,
            Tensor.__array__: self._numpy,
            Tensor.__repr__: self._repr,
            Tensor.__format__: self._format,
            Tensor.tolist: self._tolist,
            Tensor.type: self._type,
            Tensor.record_stream: self._record_stream,
            Tensor.new_tensor: self._new_tensor,
            Tensor.type_as: self._type_as,
            # parses `Module.to(device="cuda")`'s arguments: not a factory, though it takes
            # a device keyword
            torch._C._nn._parse_to: _call,
            torch.nn.functional.one_hot: one_hot_handler(self),
            torch.nn.functional.ctc_loss: ctc_loss_handler(self),
            torch.linspace: host_factory_handler(self),
            torch.logspace: host_factory_handler(self),
            torch._pack_padded_sequence: host_outputs_handler(self, (1,)),
            torch._pad_packed_sequence: host_outputs_handler(self, (1,)),
        }

    @property
    def st(self) -> ThreadContext:
        """The calling thread's context (the handlers run in whichever thread calls them)."""
        if self.thread_states:
            return self.thread_states.get(get_ident(), self.main_state)
        return self.main_state

    # ----- marks -----
    def on_device(self, t: Tensor) -> bool:
        return self.cuda_marks.has(storage_of(t))

    def mark_cuda(self, t: Tensor) -> None:
        self.cuda_marks.add(storage_of(t))

    def mixed(self, info: Any, ins: list[Tensor], dev_in: list[bool]) -> bool:
        """An op over tensors on both devices: raise what a real GPU raises, unless the op
        takes them so; True if it is `copy_` between them (a copy, run as one)."""
        if info.mixed_ok:
            return info.short == "copy_"
        self.check_mixed(ins, dev_in)
        return False

    def check_mixed(self, ins: list[Tensor], dev_in: list[bool]) -> None:
        """Raise what a real GPU raises for an op over tensors on two devices."""
        seen: list[str] = []
        for t, on in zip(ins, dev_in):
            if not on and t.dim() == 0:
                continue  # a 0-dim host tensor is passed to the kernel as a scalar
            name = "cuda:0" if on else "cpu"
            if name not in seen:
                seen.append(name)
        if len(seen) > 1:
            raise RuntimeError("Expected all tensors to be on the same device, but found at "
                               f"least two devices, {seen[0]} and {seen[1]}!")

    def device_clock(self) -> int:
        tl = self.st.timeline
        return max(tl.host_ns, tl.device_ns)

    def host_wait(self, kind: str) -> None:
        self.st.host_wait(kind)

    # ----- sync-debug mode -----
    def set_sync_debug_mode(self, debug_mode: int | str) -> None:
        """torch.cuda.set_sync_debug_mode, as PyTorch parses its argument."""
        if isinstance(debug_mode, str):
            levels = {"default": 0, "warn": 1, "error": 2}
            if debug_mode not in levels:
                raise RuntimeError("invalid value of debug_mode, expected one of `default`, "
                                   "`warn`, `error`")
            debug_mode = levels[debug_mode]
        self.sync_debug = int(debug_mode)

    def synced(self) -> None:
        """A sync that PyTorch's sync-debug mode flags on a GPU (memcpy_and_sync and
        stream_synchronize call warn_or_error_on_sync): warn or raise as it would, so that a
        program, and `profile --light`, see the same on the simulated GPU."""
        if self.sync_debug == 1:
            warnings.warn(SYNC_DEBUG_WARNING, UserWarning, stacklevel=2)
        elif self.sync_debug > 1:
            raise RuntimeError(SYNC_DEBUG_WARNING)

    def suspended(self) -> Any:
        """The calling thread's work untraced until the block ends (ThreadContext.suspend)."""
        return self.st.suspend()

    # ----- device queries -----
    def _device(self, func: Any, args: tuple, kwargs: dict) -> Any:
        return CUDA0 if self.on_device(args[0]) else func(*args)

    def _is_cuda(self, func: Any, args: tuple, kwargs: dict) -> Any:
        return self.on_device(args[0]) or func(*args)

    def _is_cpu(self, func: Any, args: tuple, kwargs: dict) -> Any:
        return not self.on_device(args[0]) and func(*args)

    def _get_device(self, func: Any, args: tuple, kwargs: dict) -> Any:
        return 0 if self.on_device(args[0]) else func(*args, **kwargs)

    def _is_pinned(self, func: Any, args: tuple, kwargs: dict) -> Any:
        return self.pinned_marks.has(storage_of(args[0]))

    def _type(self, func: Any, args: tuple, kwargs: dict) -> Any:
        if len(args) == 1 and not kwargs and self.on_device(args[0]):
            return "torch.cuda." + func(*args).rsplit(".", 1)[-1]
        return func(*args, **kwargs)

    def _record_stream(self, func: Any, args: tuple, kwargs: dict) -> Any:
        return None

    def _numpy(self, func: Any, args: tuple, kwargs: dict) -> Any:
        if self.on_device(args[0]):
            raise TypeError("can't convert cuda:0 device type tensor to numpy. Use Tensor.cpu() "
                            "to copy the tensor to host memory first.")
        return func(*args, **kwargs)

    # ----- transfers -----
    def _to(self, func: Any, args: tuple, kwargs: dict) -> Any:
        t, rest = args[0], args[1:]
        kwargs = dict(kwargs)
        copy = bool(kwargs.pop("copy", False))
        if rest and isinstance(rest[0], Tensor):
            other = rest[0]
            device = CUDA0 if self.on_device(other) else CPU
            dtype, memory_format = other.dtype, kwargs.get("memory_format")
            non_blocking = bool(rest[1] if len(rest) > 1 else kwargs.get("non_blocking", False))
        else:
            if rest and isinstance(rest[0], int) and not isinstance(rest[0], bool):
                rest = (normalize_device(rest[0]),) + rest[1:]
            if isinstance(kwargs.get("device"), int):
                kwargs["device"] = normalize_device(kwargs["device"])
            device, dtype, non_blocking, memory_format = _parse_to(*rest, **kwargs)
        return self.transfer(t, device, dtype, non_blocking, copy, memory_format, "to")

    def _type_as(self, func: Any, args: tuple, kwargs: dict) -> Any:
        other = args[1]
        return self.transfer(args[0], CUDA0 if self.on_device(other) else CPU, other.dtype,
                             False, False, None, "to")

    def dispatch_transfer(self, func: Any, args: tuple, kwargs: dict) -> Any:
        """`aten::_to_copy` to a real cuda device, from torch code the function mode did not
        see (a factory under torch.set_default_device("cuda"), say): a copy to the device.
        (One to the host cannot be told from a change of dtype: aten names the host device
        in both; the ops whose C++ code copies to the host are in tracer/syncpoints.py.)"""
        with torch._C.DisableTorchFunction():
            return self.transfer(args[0], CUDA0, kwargs.get("dtype"),
                                 bool(kwargs.get("non_blocking", False)), True,
                                 kwargs.get("memory_format"), self.st.trigger or "to")

    def dispatch_copy(self, func: Any, args: tuple, kwargs: dict) -> Any:
        """`aten::copy_` between the host and the device from torch's C++ code (a composite
        op's), recorded at the user's line."""
        with torch._C.DisableTorchFunction():
            return self._copy_(func, args, kwargs)

    def _cuda(self, func: Any, args: tuple, kwargs: dict) -> Any:
        device = args[1] if len(args) > 1 else kwargs.get("device")
        device = normalize_device(device) if device is not None else CUDA0
        non_blocking = bool(args[2] if len(args) > 2 else kwargs.get("non_blocking", False))
        return self.transfer(args[0], device, None, non_blocking, False,
                             kwargs.get("memory_format"), "cuda")

    def _cpu(self, func: Any, args: tuple, kwargs: dict) -> Any:
        return self.transfer(args[0], CPU, None, False, False, kwargs.get("memory_format"),
                             "cpu")

    def raw_copy(self, t: Tensor, dtype: Any, memory_format: Any) -> Tensor:
        """A host copy into a fresh storage, untraced."""
        with self.suspended(), torch._C.DisableTorchFunction():
            return t.to(dtype=dtype or t.dtype,
                        memory_format=memory_format or torch.preserve_format, copy=True)

    def transfer(self, t: Tensor, device: Any, dtype: Any, non_blocking: bool, copy: bool,
                 memory_format: Any, trigger: str) -> Tensor:
        """Tensor.to() between host and the simulated device, with the copy recorded."""
        src_cuda = self.on_device(t)
        if device is not None and device.type not in ("cuda", "cpu"):
            return t.to(device, dtype, non_blocking, copy, memory_format=memory_format
                        or torch.preserve_format)
        if device is not None and device.type == "cuda" and (device.index or 0) != 0:
            raise RuntimeError("CUDA error: invalid device ordinal (the simulated GPU has one "
                               "device, cuda:0)")
        dst_cuda = src_cuda if device is None else device.type == "cuda"
        if dst_cuda == src_cuda:
            kw: dict[str, Any] = {"copy": copy}
            if dtype is not None:
                kw["dtype"] = dtype
            if memory_format is not None:
                kw["memory_format"] = memory_format
            return t.to(**kw)  # same device: dispatch propagates the marks

        st = self.st
        st.gap()
        site = st.sites.resolve()
        if t.requires_grad and torch.is_grad_enabled():
            out = _SimTransfer.apply(t, self, dst_cuda, dtype, memory_format)
        else:
            out = self.raw_copy(t, dtype, memory_format)
        if dst_cuda:
            self.mark_cuda(out)
            direction = "HtoD"
            pinned = self.pinned_marks.has(storage_of(t))
        else:
            direction = "DtoH"
            pinned = non_blocking  # torch copies into pinned memory when non_blocking
            if pinned:
                self.pinned_marks.add(storage_of(out))
        self._record(direction, non_blocking, pinned, trigger, t, out, site)
        return out

    def _record(self, direction: str, non_blocking: bool, pinned: bool, trigger: str,
                src: Tensor | None, dst: Tensor, site: Any, quiet: bool = False,
                into_existing: bool = False, asked: bool | None = None) -> None:
        """`non_blocking`: the copy runs as PyTorch's non_blocking path (cudaMemcpyAsync);
        `asked`: the call asked non_blocking (where it differs: `_copy_` into pageable
        memory); `quiet`: a sync that sync-debug mode does not flag on a GPU (see `_copy_`);
        `into_existing`: `dst` was there before (`copy_`)."""
        st, profile, tl = self.st, self.st.profile, self.st.timeline
        nbytes = dst.nbytes
        if nbytes == 0:  # torch skips the memcpy of an empty tensor
            return
        device_ns = profile.copy_ns(direction, nbytes, pinned)
        if not non_blocking:
            if self.sync_debug and not quiet:
                self.synced()
            sync, host_ns = True, tl.blocking(profile.launch_ns, device_ns, profile.sync_ns)
        elif pinned:
            sync, host_ns = False, tl.enqueue(profile.launch_ns, device_ns)
        else:  # non_blocking from pageable memory: the host stages it, blocked for the copy
            # at pageable bandwidth, with no wait for earlier work (Timeline.staged; the why
            # and CUDA's words are in docs/sim-time.md). A sync copy that shows it asked
            # non_blocking; PyTorch's non_blocking path never calls warn_or_error_on_sync.
            sync, host_ns = True, tl.staged(profile.launch_ns, device_ns)
        st.record_copy(direction, sync, pinned, trigger, nbytes, host_ns, device_ns, site, src,
                       dst, dst, into_existing, non_blocking if asked is None else asked)
        if src is not None:
            st.collector.inherit_producer(dst, src)

    def _copy_(self, func: Any, args: tuple, kwargs: dict) -> Any:
        dst, src = args[0], args[1]
        non_blocking = bool(args[2] if len(args) > 2 else kwargs.get("non_blocking", False))
        if not isinstance(src, Tensor) or self.on_device(dst) == self.on_device(src):
            return func(*args, **kwargs)
        st = self.st
        st.gap()
        site = st.sites.resolve()
        with self.suspended():
            func(dst, src, non_blocking)
        asked = non_blocking
        if self.on_device(dst):
            direction, pinned = "HtoD", self.pinned_marks.has(storage_of(src))
        else:
            direction, pinned = "DtoH", self.pinned_marks.has(storage_of(dst))
            non_blocking = non_blocking and pinned  # into pageable memory the host waits
        # (PyTorch's non_blocking path, cudaMemcpyAsync, never calls warn_or_error_on_sync)
        self._record(direction, non_blocking, pinned, "copy_", src, dst, site, quiet=asked,
                     into_existing=True, asked=asked)
        return dst

    def pin_tensor(self, t: Tensor, st: ThreadContext | None = None) -> Tensor:
        """A pinned copy of a host tensor (untraced; safe from another thread), its copy into
        page-locked memory paid by `st`'s host (docs/sim-time.md) or, where not given, by the
        calling thread's if it is traced (a DataLoader with num_workers=0 pins in it)."""
        out = self.raw_copy(t, None, torch.contiguous_format)
        self.pinned_marks.add(storage_of(out))
        if st is None:
            ident = get_ident()
            st = self.thread_states.get(ident) or (
                self.main_state if ident == self.main_ident else None)
        if st is not None and st.timeline is not None:
            st.timeline.host(st.profile.pin_ns(t.nbytes))
        return out

    def _pin_memory(self, func: Any, args: tuple, kwargs: dict) -> Any:
        t = args[0]
        if self.on_device(t):
            raise RuntimeError(f"cannot pin '{self._type(Tensor.type, (t,), {})}' only dense "
                               "CPU tensors can be pinned")
        st = self.st
        out = self.pin_tensor(t, st)
        st.collector.inherit_producer(out, t)
        return out

    # ----- factories -----
    def _new_tensor(self, func: Any, args: tuple, kwargs: dict) -> Any:
        """t.new_tensor(data) builds on t's device: from a cuda t, a copy from the host."""
        if "device" not in kwargs and self.on_device(args[0]):
            kwargs = {**kwargs, "device": CUDA0}
        return self.factory(func, args, kwargs)

    def any_cuda(self, args: tuple, kwargs: dict) -> bool:
        on_device = self.on_device
        return any(on_device(t) for t in tensors_in(args, kwargs))

    def factory(self, func: Any, args: tuple, kwargs: dict) -> Any:
        """A call with `device=` or `pin_memory=`: build on the host, mark the result."""
        device = normalize_device(kwargs.get("device"))
        pin = bool(kwargs.get("pin_memory", False))
        new_kwargs = dict(kwargs)
        if device is not None and device.type == "cuda":
            if (device.index or 0) != 0:
                raise RuntimeError("CUDA error: invalid device ordinal (the simulated GPU has "
                                   "one device, cuda:0)")
            new_kwargs["device"] = CPU
        if pin:
            new_kwargs["pin_memory"] = False
        cuda = None if device is None else device.type == "cuda"
        data = self.read_factory_data(func, args, kwargs)
        if cuda is False and func in DATA_FACTORIES and isinstance(data, Tensor) and (
                self.on_device(data)):  # `var.to(device)` of a device tensor to the host
            self.read_back(data, "factory", data.nbytes)
            args, new_kwargs = _with_data(func, args, new_kwargs,
                                          self.raw_copy(data, None, None))
        copies = (cuda and func in DATA_FACTORIES
                  and not (isinstance(data, Tensor) and self.on_device(data)))
        st = self.st
        if copies:
            st.gap()
            site = st.sites.resolve()
        prev = st.forced
        st.forced = cuda
        try:
            out = func(*args, **new_kwargs)
        finally:
            st.forced = prev
        outs = tensors_out(out)
        for o in outs:
            if cuda:
                self.mark_cuda(o)
            if pin:
                self.pinned_marks.add(storage_of(o))
        if copies and outs:
            self._record("HtoD", False, False, "factory",
                         data if isinstance(data, Tensor) else None, outs[0], site)
        return out

    def read_factory_data(self, func: Any, args: tuple, kwargs: dict) -> Any:
        """The data argument of a factory (`torch.tensor(data)`, ...), with the reads of the
        device tensors inside a list of them recorded: torch reads each one's value."""
        first = 1 if func is Tensor.new_tensor else 0
        data = args[first] if len(args) > first else kwargs.get("data", kwargs.get("obj"))
        if isinstance(data, (list, tuple)):
            for t in tensors_in_data(data):
                if self.on_device(t):
                    self.read_back(t, "factory", t.nbytes)
        return data

    def storage_copy(self, direction: str, storage: Any, trigger: str) -> None:
        """A whole storage copied between host and device by torch.save or torch.load."""
        with self.suspended(), torch._C.DisableTorchFunction():
            view = torch.empty(0, dtype=torch.uint8).set_(storage)
        st = self.st
        st.gap()
        st.sync_copy(direction, trigger, storage.nbytes(), view, st.sites.resolve(), 0)

    # ----- reads to the host -----
    def _repr(self, func: Any, args: tuple, kwargs: dict) -> Any:
        t = args[0]
        if not self.on_device(t):
            return func(*args, **kwargs)
        self.read_back(t, "print", printed_bytes(t))
        return self._device_repr(t, kwargs.get("tensor_contents"))

    def _device_repr(self, t: Tensor, tensor_contents: Any = None) -> str:
        """torch's own formatting (as Tensor.__repr__ does it), asked about the device
        through a mode that answers from the marks, so the text says device='cuda:0'."""
        with _AnswerDevice(self), torch.no_grad(), _disable_current_modes():
            guard = torch._C._DisableFuncTorch()  # noqa: F841  (as torch's _str does)
            return torch._tensor_str._str_intern(t, tensor_contents=tensor_contents)

    def _format(self, func: Any, args: tuple, kwargs: dict) -> Any:
        t = args[0]
        if not self.on_device(t) or t.dim() == 0:
            st = self.st
            prev, st.trigger = st.trigger, "format"
            try:
                return func(*args, **kwargs)  # a 0-dim tensor reads its value with item()
            finally:
                st.trigger = prev
        if args[1:] and args[1]:
            return func(*args, **kwargs)  # a format spec on a non-scalar: torch's TypeError
        self.read_back(t, "print", printed_bytes(t))
        return self._device_repr(t)

    def _tolist(self, func: Any, args: tuple, kwargs: dict) -> Any:
        t = args[0]
        if self.on_device(t):
            self.read_back(t, "tolist", t.nbytes)
        return func(*args, **kwargs)

    def read_back(self, t: Tensor, trigger: str, nbytes: int) -> None:
        """A read of `nbytes` of the device tensor `t` that the host waits for."""
        st = self.st
        st.gap()
        st.sync_copy("DtoH", trigger, nbytes, t, st.sites.resolve(), 0)
