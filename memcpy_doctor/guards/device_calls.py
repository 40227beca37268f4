"""What `device_guard` does with each torch call, and the mode that does it.

The rules themselves are described in guards/device.py's docstring; this module holds their
tables and `_GuardMode`, the torch function mode that applies them. Each torch function is sorted
once (`_classify`, cached) into: passed through as written (explicit transfers, host reads,
metadata), a view (must alias its tensor, so never moved), a factory or `*_like` / `new_*` call
(built on the guard's device unless `device=` or `out=` says otherwise), or an op (its tensor
arguments copied to the guard's device, and what it writes in place copied back).

Kept apart from the module-pinning half (guards/device_modules.py) because this half is about
single calls and knows nothing of `nn.Module`; it also holds the per-thread record of open guard
blocks, which both halves and the public `device_guard` read.
"""

from __future__ import annotations

import inspect
import threading
from types import FrameType
from typing import Any, NamedTuple

import torch
from ..core.guardstate import GUARD_DEPTH
from ..core.torch_private import TorchFunctionMode, _device_constructors

Tensor = torch.Tensor

#: Device types whose tensors the guard copies; others (meta, ...) have no data to move.
_MOVABLE_TYPES = ("cpu", "cuda")


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


# ----- the open guard blocks of each thread, and the mode -----

class _Entry:
    """One open guard block: its device and the frames that were running when it opened."""

    __slots__ = ("device", "frames")

    def __init__(self, device: torch.device, frames: tuple[FrameType, ...]) -> None:
        self.device = device
        self.frames = frames


class _ThreadState(threading.local):
    """Per thread, as torch's mode stack is: guard blocks now open (the modes entered are counted
    in core.guardstate)."""

    def __init__(self) -> None:
        self.busy = False  # a guard is running a call: the guards below it stand aside
        self.entries: list[_Entry] = []  # guard blocks open, innermost last


_thread = _ThreadState()


class _GuardMode(TorchFunctionMode):
    """Runs every torch call on one device (the rules are in guards/device.py's docstring).

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
