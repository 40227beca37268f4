"""`device_guard`: run a block's ops, and keep the modules it builds, on one device, as Paddle's
`fluid.device_guard` does (../shared/design/origin.md, "device_guard in Paddle").

    with device_guard("cpu"):
        self.emb = nn.Embedding(10_000_000, 150)   # stays in host memory
    model.to("cuda")       # everything but the embedding goes to the GPU
    out = model(ids)       # the lookup runs on the host; its output comes back to cuda

Inside the guard a torch function mode rewrites each torch call before running it:
- a factory called without `device=` (or `out=`) builds on the guard's device;
- tensor arguments living on another device are copied there first with `.to(device)`, so a
  tracer records each copy like any other; a 0-dim host tensor stays (a kernel takes it as a
  scalar). An op that writes into a tensor that had to be copied (`x.add_(y)`, `x[i] = v`,
  `out=`) writes the result back with `copy_`: a tensor cannot change device in place;
- explicit transfers (`.to()`, `.cuda()`, `.cpu()`, `copy_`), reads to the host (`item()`,
  `print`), metadata (`t.device`, `t.shape`) and views (`t[0]`, `view`, `detach`) run as
  written: a view must alias its tensor or writes through it would be lost.

A module constructed inside the guard carries two instance attributes, nothing global: its
`_apply` pins its tensors to the guard's device whatever `Module.to/cuda/cpu` asks (dtype
changes apply), and its `forward` runs under the guard and, called from unguarded code,
returns its outputs on the device of its first tensor input. "Constructed inside" is read from
torch's module registration hooks, registered only while a guard block is open: the module
registers a parameter, buffer or submodule in its own `__init__`, which started after the
guard opened. Backward ops run where autograd put them: on their forward op's device.

Limits: the guard rewrites only calls that reach it first, so open guard blocks inside a
profiler, not around one (a guarded module enters its guard when called, wherever it was
built); a module that registers nothing (`nn.ReLU()`) is not recognised; a guarded module's
own `.to()` is pinned too.
"""

from __future__ import annotations

import inspect
import sys
import threading
import weakref
from contextlib import ContextDecorator, ExitStack
from types import FrameType
from typing import Any, Callable, NamedTuple

import torch
from torch.nn.modules import module as _nn_module
from ..core.guardstate import GUARD_DEPTH, inside_guard
from ..core.torch_private import TorchFunctionMode, _device_constructors, _parse_to

Tensor = torch.Tensor

#: The device names device_guard accepts (Paddle's "gpu" means cuda), by the torch type.
DEVICE_NAMES = {"cpu": "cpu", "cuda": "cuda", "gpu": "cuda"}

#: Device types whose tensors the guard copies; others (meta, ...) have no data to move.
_MOVABLE_TYPES = ("cpu", "cuda")


def parse_device(device: str) -> torch.device:
    """"cpu", "cuda", "cuda:N", "gpu", "gpu:N" as a torch.device; anything else: ValueError."""
    if isinstance(device, str):
        name, colon, index = device.partition(":")
        kind = DEVICE_NAMES.get(name)
        if kind is not None and not colon:
            return torch.device(kind)
        if kind == "cuda" and index.isdigit() and index.isascii():
            return torch.device(kind, int(index))
    raise ValueError("device_guard: device must be 'cpu', 'cuda', 'cuda:N', 'gpu' or 'gpu:N', "
                     f"not {device!r}")


def _resolve(device: torch.device) -> torch.device:
    """'cuda' without an index is the current CUDA device, when there is one to ask."""
    if device.type == "cuda" and device.index is None and torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return device


# ----- what the guard does with each torch call -----

_PASS, _VIEW, _GETITEM, _FACTORY, _LIKE, _OP = "pass", "view", "getitem", "factory", "like", "op"

_PASS_TENSOR_METHODS = (
    # explicit transfers and placement: honoured as written
    "to", "cuda", "cpu", "xpu", "mtia", "ipu", "copy_", "type", "type_as", "pin_memory",
    "is_pinned", "share_memory_", "record_stream",
    # autograd bookkeeping
    "requires_grad_", "retain_grad", "register_hook", "register_post_accumulate_grad_hook",
    "backward", "detach_",
    # storage and metadata
    "resize_", "resize_as_", "set_", "untyped_storage", "storage", "_typed_storage",
    "data_ptr", "element_size", "size", "dim", "ndimension", "stride", "numel", "nelement",
    "storage_offset", "is_contiguous", "is_floating_point", "is_complex", "is_signed",
    "is_inference", "get_device", "is_set_to", "is_shared", "has_names", "dim_order",
    "__len__", "__hash__", "__reduce_ex__", "__deepcopy__", "__setstate__", "__dlpack__",
    "__dlpack_device__",
    # reads to the host: the tracer names their copies (item, print, ...)
    "item", "tolist", "numpy", "__array__", "__bool__", "__float__", "__int__", "__index__",
    "__complex__", "__repr__", "__format__", "is_nonzero",
    # host-only Python callbacks
    "apply_", "map_", "map2_",
)
_PASS_TORCH_FUNCTIONS = ("is_nonzero", "numel", "is_floating_point", "is_complex",
                         "result_type", "is_same_size")
_VIEW_NAMES = (
    "view", "view_as", "reshape", "reshape_as", "as_strided", "expand", "expand_as", "narrow",
    "select", "squeeze", "unsqueeze", "transpose", "t", "permute", "movedim", "moveaxis",
    "swapaxes", "swapdims", "unflatten", "flatten", "unbind", "split", "split_with_sizes",
    "chunk", "tensor_split", "hsplit", "vsplit", "dsplit", "diagonal", "unfold",
    "view_as_real", "view_as_complex", "detach", "alias", "contiguous", "adjoint", "conj",
    "real", "imag", "indices", "values", "squeeze_", "unsqueeze_", "t_", "transpose_",
    "swapaxes_", "swapdims_", "as_strided_",
)
_LIKE_NAMES = ("empty_like", "zeros_like", "ones_like", "full_like", "rand_like",
               "randn_like", "randint_like")
_NEW_NAMES = ("new_empty", "new_empty_strided", "new_zeros", "new_ones", "new_full",
              "new_tensor")
_IN_PLACE_DUNDERS = frozenset({
    "__setitem__", "__iadd__", "__isub__", "__imul__", "__itruediv__", "__ifloordiv__",
    "__imod__", "__ipow__", "__iand__", "__ior__", "__ixor__", "__ilshift__", "__irshift__",
})
_PROPERTY_ACCESS = frozenset({"__get__", "__set__", "__delete__"})


def _present(owner: Any, names: tuple[str, ...]) -> set[Any]:
    return {getattr(owner, n) for n in names if hasattr(owner, n)}


_PASS_FUNCS = (_present(Tensor, _PASS_TENSOR_METHODS) | _present(torch, _PASS_TORCH_FUNCTIONS)
               | {torch.autograd.backward, torch.autograd.grad})
_VIEW_FUNCS = _present(Tensor, _VIEW_NAMES) | _present(torch, _VIEW_NAMES)
_LIKE_FUNCS = _present(torch, _LIKE_NAMES) | _present(Tensor, _NEW_NAMES)


class _Call(NamedTuple):
    """How the guard treats one torch function (see `_classify`)."""

    kind: str
    writes_first: bool = False  # in-place: the first argument (a tensor or a list) is written
    inplace_at: int | None = None  # position of an `inplace=` parameter (torch.nn.functional)


_CALLS: dict[Any, _Call] = {}


def _classify(func: Any) -> _Call:
    call = _CALLS.get(func)
    if call is not None:
        return call
    name = getattr(func, "__name__", "")
    if name in _PROPERTY_ACCESS or func in _PASS_FUNCS:
        call = _Call(_PASS)
    elif func is Tensor.__getitem__:
        call = _Call(_GETITEM)
    elif func in _VIEW_FUNCS:
        call = _Call(_VIEW)
    elif func in _device_constructors():
        call = _Call(_FACTORY)
    elif func in _LIKE_FUNCS:
        call = _Call(_LIKE)
    else:
        writes = (name.endswith("_") and not name.startswith("__")) or name in _IN_PLACE_DUNDERS
        call = _Call(_OP, writes, _inplace_index(func))
    _CALLS[func] = call
    return call


def _inplace_index(func: Any) -> int | None:
    try:
        names = list(inspect.signature(func).parameters) if inspect.isfunction(func) else []
    except (TypeError, ValueError):
        names = []
    return names.index("inplace") if "inplace" in names else None


def _basic_index(index: Any) -> bool:
    """Indexing with ints, slices, None and Ellipsis only: a view of the tensor."""
    items = index if isinstance(index, tuple) else (index,)
    return all(i is None or i is Ellipsis or isinstance(i, (int, slice)) for i in items)


def _rebuild(seq: Any, items: list[Any]) -> Any:
    """`items` in a sequence of seq's type (list, tuple, named tuple or torch.return_types)."""
    kind = type(seq)
    if kind in (list, tuple):
        return kind(items)
    if hasattr(kind, "_fields"):
        return kind(*items)
    return kind(items)


def _written(call: _Call, args: tuple, kwargs: dict) -> list[Tensor]:
    """The tensors a call writes into: an in-place op's first argument, `out=`."""
    targets = []
    if args and (call.writes_first or kwargs.get("inplace") is True or (
            call.inplace_at is not None and len(args) > call.inplace_at
            and args[call.inplace_at] is True)):
        targets.append(args[0])
    if kwargs.get("out") is not None:
        targets.append(kwargs["out"])
    found: list[Tensor] = []
    for t in targets:
        found.extend(t if isinstance(t, (list, tuple)) else (t,))
    return [t for t in found if isinstance(t, Tensor)]


class _ThreadState(threading.local):
    """Per thread, as torch's mode stack is: guard blocks now open (the modes entered are counted
    in core.guardstate)."""

    def __init__(self) -> None:
        self.busy = False  # a guard is running a call: the guards below it stand aside
        self.entries: list[_Entry] = []  # guard blocks open, innermost last


_thread = _ThreadState()


class _GuardMode(TorchFunctionMode):
    """Runs every torch call on one device (the rules are in the module docstring).

    Inside a handler torch pops the mode, so the rewritten call, and the `.to()` copies made
    for it, go to the modes below (a tracer's) exactly as user code would."""

    def __init__(self, device: torch.device) -> None:
        super().__init__()
        self.device = _resolve(device)

    def __enter__(self) -> _GuardMode:
        super().__enter__()
        GUARD_DEPTH.depth += 1
        return self

    def __exit__(self, *exc: Any) -> None:
        GUARD_DEPTH.depth -= 1
        super().__exit__(*exc)

    def __torch_function__(self, func: Any, types: Any, args: tuple = (),
                           kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        state = _thread
        if state.busy:  # an inner guard's call, or a call inside it: the innermost decided
            return func(*args, **kwargs)
        call = _classify(func)
        kind = call.kind
        if kind is _PASS or kind is _VIEW or (kind is _GETITEM and _basic_index(args[1])):
            return func(*args, **kwargs)
        if kind is _FACTORY or kind is _LIKE:
            if kwargs.get("device") is not None or kwargs.get("out") is not None:
                return func(*args, **kwargs)  # an explicit placement is honoured
            kwargs = {**kwargs, "device": self.device}
        state.busy = True
        try:
            return self._run(func, call, args, kwargs)
        finally:
            state.busy = False

    def _stays(self, t: Tensor) -> bool:
        d, home = t.device, self.device
        if d.type == home.type and (home.index is None or d.index == home.index):
            return True
        if d.type not in _MOVABLE_TYPES:
            return True
        return d.type == "cpu" and t.dim() == 0  # a 0-dim host tensor is a scalar to a kernel

    def _move(self, x: Any, moved: dict[int, tuple[Tensor, Tensor]]) -> Any:
        if isinstance(x, Tensor):
            if self._stays(x):
                return x
            hit = moved.get(id(x))
            if hit is None:
                hit = moved[id(x)] = (x, x.to(self.device))
            return hit[1]
        if isinstance(x, (list, tuple)) and any(isinstance(y, Tensor) for y in x):
            return _rebuild(x, [self._move(y, moved) for y in x])
        return x

    def _run(self, func: Any, call: _Call, args: tuple, kwargs: dict) -> Any:
        moved: dict[int, tuple[Tensor, Tensor]] = {}  # id(original) -> (original, its copy)
        first = 1 if call.kind is _LIKE else 0  # `x.new_zeros()`, `zeros_like(x)` read x's shape
        new_args = args[:first] + tuple(self._move(a, moved) for a in args[first:])
        new_kwargs = {k: self._move(v, moved) for k, v in kwargs.items()}
        out = func(*new_args, **new_kwargs)
        if not moved:
            return out
        back: dict[int, Tensor] = {}
        for orig in _written(call, args, kwargs):
            hit = moved.get(id(orig))
            if hit is None or id(hit[1]) in back:
                continue
            result = hit[1]
            if orig.shape != result.shape:
                orig.resize_(result.shape)
            orig.copy_(result)
            back[id(result)] = orig
        return _swap(out, back) if back else out


def _swap(out: Any, back: dict[int, Tensor]) -> Any:
    """The result with each written-back copy replaced by the tensor it was copied from."""
    if isinstance(out, Tensor):
        return back.get(id(out), out)
    if isinstance(out, (list, tuple)):
        return _rebuild(out, [_swap(o, back) for o in out])
    return out


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

class _Entry:
    """One open guard block: its device and the frames that were running when it opened."""

    __slots__ = ("device", "frames")

    def __init__(self, device: torch.device, frames: tuple[FrameType, ...]) -> None:
        self.device = device
        self.frames = frames


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


class device_guard(ContextDecorator):  # noqa: N801  (named as Paddle's, used like no_grad)
    """Run the block's torch calls on `device`, and keep the modules it builds there.

    `device` is "cpu", "cuda", "cuda:N", or Paddle's "gpu" / "gpu:N" (cuda); anything else
    raises ValueError. Guards nest, the innermost wins. Also works as a decorator.
    """

    def __init__(self, device: str) -> None:
        self._name = device
        self.device = parse_device(device)
        self._stacks: list[ExitStack] = []

    def __repr__(self) -> str:
        return f"device_guard({self._name!r})"

    def _recreate_cm(self) -> device_guard:
        return type(self)(self._name)  # a decorated function's calls each get their own

    def __enter__(self) -> device_guard:
        entry = _Entry(self.device, _frames_from(sys._getframe(1)))
        with ExitStack() as stack:
            _hooks.acquire()
            stack.callback(_hooks.release)
            _thread.entries.append(entry)
            stack.callback(_thread.entries.remove, entry)
            stack.enter_context(_GuardMode(self.device))
            self._stacks.append(stack.pop_all())
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stacks.pop().__exit__(*exc)
