"""Modules built under `device_guard`: how they are recognised and how they stay on its device.

A module constructed inside a guard block gets two instance attributes (guards/device.py's
docstring says what they do for the user): `_GuardedForward`, which runs the module's forward
under the guard's mode, and `_GuardedApply`, which pins its tensors to the guard's device through
`Module.to/cuda/cpu` (`_PinDevice`). "Constructed inside" is read from torch's global module
registration hooks (`_on_registration`), registered only while some guard block is open
(`_RegistrationHooks`).

Kept apart from guards/device_calls.py because this half is about `nn.Module` and torch's hooks,
while that one is about single calls; this half uses that one's mode, never the reverse.
"""

from __future__ import annotations

import sys
import threading
import weakref
from types import FrameType
from typing import Any, Callable

import torch
from torch.nn.modules import module as _nn_module
from ..core.guardstate import inside_guard
from ..core.torch_private import TorchFunctionMode, _parse_to
from .device_calls import _LIKE_FUNCS, _GuardMode, _present, _rebuild, _resolve, _thread

Tensor = torch.Tensor


# ----- modules built under a guard -----

class _PinDevice(TorchFunctionMode):
    """Active while `Module._apply` runs over a guarded module: every device move it asks for
    (`.to()`, `.cuda()`, `.cpu()`, `to_empty`'s `empty_like`) goes to the guard's device
    instead; dtype, memory format and non_blocking are kept."""

    def __init__(self, device: torch.device) -> None:
        super().__init__()
        self.device = _resolve(device)

    def __torch_function__(self, func: Any, types: Any, args: tuple = (),
                           kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        if func is Tensor.to:
            rest, kw = args[1:], dict(kwargs)
            copy = bool(kw.pop("copy", False))
            if rest and type(rest[0]) is int:
                rest = rest[1:]  # a bare cuda index: a device, replaced like any other
            _, dtype, non_blocking, memory_format = _parse_to(*rest, **kw)
            options = {"dtype": dtype, "memory_format": memory_format}
            return args[0].to(self.device, non_blocking=non_blocking, copy=copy,
                              **{k: v for k, v in options.items() if v is not None})
        if func in _DEVICE_MOVES:
            return args[0].to(self.device)
        if func in _LIKE_FUNCS and kwargs.get("device") is not None:
            kwargs = {**kwargs, "device": self.device}
        return func(*args, **kwargs)


_DEVICE_MOVES = _present(Tensor, ("cuda", "cpu", "xpu", "mtia", "ipu"))


class _InstanceMethod:
    """Base of the two instance attributes a guarded module carries. It holds the module
    weakly (no reference cycle keeps a large module alive after `del`), and pickles and
    deep-copies as (module, device), so a copy of the module is guarded and refers to itself."""

    name = ""

    def __init__(self, module: torch.nn.Module, device: torch.device | str,
                 inner: Callable | None = None) -> None:
        self._module = weakref.ref(module)
        self.device = torch.device(device)
        self._inner = inner  # an instance attribute the module already had, if any

    def _bound(self) -> Callable:
        module = self._module()
        if module is None:
            raise ReferenceError("the guarded module no longer exists")
        if self._inner is not None:
            return self._inner
        return getattr(type(module), self.name).__get__(module)

    @property
    def __wrapped__(self) -> Callable:  # inspect.signature() shows the original's
        return self._bound()

    def __reduce__(self) -> tuple:
        return (type(self), (self._module(), str(self.device), self._inner))


class _GuardedForward(_InstanceMethod):
    """A guarded module's `forward`: runs under the guard; called from unguarded code, returns
    its outputs on the device of its first tensor input. Called from guarded code (an
    enclosing guarded module), it leaves them where they are: the caller's guard moves what
    its ops need, without a round trip."""

    name = "forward"

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        forward = self._bound()
        home = None
        if not inside_guard():
            first = _first_tensor(args, kwargs)
            home = first.device if first is not None else None
        with _GuardMode(self.device):
            out = forward(*args, **kwargs)
        return out if home is None else _to_device(out, home)


class _GuardedApply(_InstanceMethod):
    """A guarded module's `_apply` (what Module.to/cuda/cpu/half/to_empty call): its tensors,
    and those of its submodules, stay on the guard's device; other conversions apply."""

    name = "_apply"

    def __call__(self, fn: Callable, recurse: bool = True) -> Any:
        apply = self._bound()
        with _PinDevice(self.device):
            return apply(fn) if recurse else apply(fn, recurse)


def _first_tensor(args: tuple, kwargs: dict) -> Tensor | None:
    for a in (*args, *kwargs.values()):
        if isinstance(a, Tensor):
            return a
        if isinstance(a, (list, tuple)):
            for b in a:
                if isinstance(b, Tensor):
                    return b
    return None


def _to_device(out: Any, device: torch.device) -> Any:
    if isinstance(out, Tensor):
        return out if out.device == device else out.to(device)
    if isinstance(out, (list, tuple)):
        return _rebuild(out, [_to_device(o, device) for o in out])
    if isinstance(out, dict):
        return type(out)((k, _to_device(v, device)) for k, v in out.items())
    return out


def guarded_device(module: torch.nn.Module) -> torch.device | None:
    """The device of the guard `module` was built under, or None."""
    forward = vars(module).get("forward")
    return forward.device if isinstance(forward, _GuardedForward) else None


def _mark(module: torch.nn.Module, device: torch.device) -> None:
    attrs = vars(module)  # set directly: these are methods, not state Module.__setattr__ sorts
    attrs["forward"] = _GuardedForward(module, device, attrs.get("forward"))
    attrs["_apply"] = _GuardedApply(module, device, attrs.get("_apply"))


# ----- recognising modules built inside a guard -----

def _frames_from(frame: FrameType | None) -> tuple[FrameType, ...]:
    frames = []
    while frame is not None:
        frames.append(frame)
        frame = frame.f_back
    return tuple(frames)


def _init_frame(module: torch.nn.Module) -> FrameType | None:
    """The outermost running `__init__` of `module` (its most derived class's), or None."""
    found = None
    frame = sys._getframe(2)
    while frame is not None:
        code = frame.f_code
        if (code.co_name == "__init__" and code.co_argcount
                and frame.f_locals.get(code.co_varnames[0]) is module):
            found = frame
        frame = frame.f_back
    return found


def _on_registration(module: torch.nn.Module, name: str, value: Any) -> None:
    """torch's registration hook (parameters, buffers, submodules): mark `module` if it is
    being constructed inside a guard. A guard opened inside the module's own `__init__`
    (`with device_guard("cpu"): self.emb = ...`) guards what it builds, not the module."""
    entries = _thread.entries  # empty on threads without a guard: hooks are process-wide
    if value is None or not entries or guarded_device(module) is not None:
        return None
    init = _init_frame(module)
    if init is None:
        return None
    for entry in reversed(entries):  # innermost first
        if not any(f is init for f in entry.frames):
            _mark(module, entry.device)
            break
    return None


class _RegistrationHooks:
    """torch's global module registration hooks, registered while any guard block is open in
    any thread, and removed when the last one closes."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._users = 0
        self._handles: list[Any] = []

    def acquire(self) -> None:
        with self._lock:
            if self._users == 0:
                self._handles = [
                    _nn_module.register_module_parameter_registration_hook(_on_registration),
                    _nn_module.register_module_buffer_registration_hook(_on_registration),
                    _nn_module.register_module_module_registration_hook(_on_registration),
                ]
            self._users += 1

    def release(self) -> None:
        with self._lock:
            self._users -= 1
            if self._users == 0:
                for handle in self._handles:
                    handle.remove()
                self._handles = []


_hooks = _RegistrationHooks()
