"""What each aten op means for copies: kernels, views, and the ops that make the host wait.

Looked up by `func._overloadpacket` through `op_info()`, cached per overload, so the per-op
path pays one dictionary lookup. The copies ops make inside their device code are the rules
of tracer/syncpoints.py (docs/cuda-sync-points.md); the rest follows docs/cuda-semantics.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch

from torch._ops import OpOverload

from ..core.torch_private import flop_registry
from .syncpoints import BACKWARD_RULES, HOST_ARGUMENTS, SYNC_RULES, SyncRule, declared_rule

#: Python-level calls that cause copies, by the trigger name a copy they cause is given.
TRIGGERS: dict[Any, str] = {
    torch.Tensor.item: "item",
    torch.Tensor.__float__: "float",
    torch.Tensor.__int__: "int",
    torch.Tensor.__bool__: "bool",
    torch.Tensor.__index__: "__index__",
    torch.is_nonzero: "bool",
    torch.Tensor.tolist: "tolist",
    torch.Tensor.__repr__: "print",
    torch.Tensor.__format__: "format",
    torch.Tensor.to: "to",
    torch.Tensor.cuda: "cuda",
    torch.Tensor.cpu: "cpu",
    torch.Tensor.copy_: "copy_",
    torch.tensor: "factory",
    torch.as_tensor: "factory",
    torch.asarray: "factory",
    torch.Tensor.new_tensor: "factory",
    torch.Tensor.backward: "backward",
    torch.autograd.backward: "backward",
    torch.autograd.grad: "backward",
}

#: Python-level calls that read a tensor's metadata only (no aten op, never a copy): the
#: function mode passes them through as cheaply as property reads.
METADATA_CALLS = frozenset({
    torch.Tensor.dim, torch.Tensor.ndimension, torch.Tensor.size, torch.Tensor.numel,
    torch.Tensor.nelement, torch.Tensor.stride, torch.Tensor.storage_offset,
    torch.Tensor.is_contiguous, torch.Tensor.element_size, torch.Tensor.is_floating_point,
    torch.Tensor.is_complex, torch.Tensor.is_signed, torch.Tensor.__len__,
    torch.Tensor.data_ptr, torch.Tensor.is_inference,
})

#: Triggers that name the Python call behind a one-element read (`aten::_local_scalar_dense`).
SCALAR_TRIGGERS = frozenset({"item", "float", "int", "bool", "__index__", "format"})

#: Factories that copy their data argument from the host.
DATA_FACTORIES = frozenset({torch.tensor, torch.as_tensor, torch.asarray,
                            torch.Tensor.new_tensor})

#: Ops that allocate or reinterpret memory without launching a kernel.
_NO_KERNEL = {
    "empty", "empty_strided", "empty_like", "new_empty", "new_empty_strided", "set_",
    "resize_", "lift_fresh", "_has_compatible_shallow_copy_type", "is_same_size", "is_set_to",
    "_local_scalar_dense", "_linalg_check_errors",
}

#: Ops that accept tensors on different devices (the copy between them is the op's job).
MIXED_DEVICE_OK = {
    "copy_", "_to_copy", "_copy_from", "_copy_from_and_resize", "index", "index_put_",
    "index_put", "_index_put_impl_", "set_", "lift_fresh", "_has_compatible_shallow_copy_type",
    "is_same_size", "is_set_to",
}

_PASS_THROUGH = {"detach", "alias", "lift_fresh"}

_INDEX_OPS = {"index", "index_put_", "index_put", "_index_put_impl_"}


@dataclass(frozen=True)
class OpInfo:
    """What the tracer needs to know about one aten overload."""

    name: str  # "aten::mm"
    short: str  # "mm"
    kernel: bool  # launches device work (views and allocations do not)
    sync: SyncRule | None  # what it copies inside its device code (tracer/syncpoints.py)
    index: bool  # indexing: may read a mask or a host index tensor
    #: may copy between device and host inside its own code or its backward's (sync, index,
    #: backward): takes the rarer step after the op (opreads.after_op) when an input is on
    #: the device
    reads: bool
    mixed_ok: bool
    flops: Callable[[tuple, dict, list], int] | None  # (args, kwargs, outputs) -> FLOPs
    #: hands back its input's data unchanged: the producer stays the op that made it
    pass_through: bool
    #: its schema's one tensor argument is its first (a view's, a sum's, a scalar op's): its
    #: tensor inputs are the first argument alone, whatever the others hold
    lone_tensor: bool
    #: what calling the overload calls: OpOverload.__call__ only forwards to the C++ `_op`,
    #: and calling that directly saves a Python frame an op
    call: Callable[..., Any]
    #: what its backward formula reads on the host (tracer/syncpoints.py, BACKWARD_RULES)
    backward: SyncRule | None = None
    #: a CompositeImplicitAutograd op (`item`, `is_nonzero`, `argwhere`, ...): autograd
    #: decomposes it before the dispatch mode sees it, except where autograd's keys are off
    #: (inference mode, a custom Function's forward); there the per-op path decomposes it
    #: itself, so that its parts (`_local_scalar_dense`, `nonzero`) are recorded as always
    composite: bool = False


def _mm_flops(args: tuple, kwargs: dict, outs: list) -> int:
    m, k = args[0].shape  # one read of each shape: a read builds a torch.Size
    return 2 * m * k * args[1].shape[1]


def _addmm_flops(args: tuple, kwargs: dict, outs: list) -> int:
    return _mm_flops(args[1:], kwargs, outs)


def _bmm_flops(args: tuple, kwargs: dict, outs: list) -> int:
    batch, m, k = args[0].shape
    return 2 * batch * m * k * args[1].shape[2]


def _baddbmm_flops(args: tuple, kwargs: dict, outs: list) -> int:
    return _bmm_flops(args[1:], kwargs, outs)


#: The commonest formulas, written out: flop_counter's generic ones map over pytrees, which
#: costs more than the rest of the per-op path together.
_FAST_FLOPS: dict[str, Callable[[tuple, dict, list], int]] = {
    "mm": _mm_flops, "addmm": _addmm_flops, "bmm": _bmm_flops, "baddbmm": _baddbmm_flops,
}


def _registry_flops(formula: Callable[..., int]) -> Callable[[tuple, dict, list], int]:
    """A flop_counter formula as OpInfo.flops calls it; 0 where it does not fit the call's
    arguments (the fast formulas above always do: their op has run with them)."""
    def flops(args: tuple, kwargs: dict, outs: list) -> int:
        try:
            return formula(*args, **kwargs, out_val=outs[0] if len(outs) == 1 else outs)
        except Exception:  # a formula that does not fit these arguments
            return 0
    return flops


#: OpInfo by id(func): OpOverload hashes in Python, an id in C. The overloads are kept in
#: _KEPT so that no cached id is reused.
OP_INFO: dict[int, OpInfo] = {}
_KEPT: list[Any] = []


def op_info(func: Any) -> OpInfo:
    info = OP_INFO.get(id(func))
    if info is None:
        packet = func._overloadpacket
        short = packet.__name__
        ns = func.namespace
        is_view = bool(getattr(func, "is_view", False))
        sync = SYNC_RULES.get(f"{ns}::{short}")
        backward = BACKWARD_RULES.get(f"{ns}::{short}")
        info = OpInfo(
            name=f"{ns}::{short}",
            short=short,
            kernel=not is_view and short not in _NO_KERNEL,
            sync=sync,
            index=short in _INDEX_OPS,
            backward=backward,
            reads=sync is not None or backward is not None or short in _INDEX_OPS,
            mixed_ok=short in MIXED_DEVICE_OK or short in HOST_ARGUMENTS,
            flops=_FAST_FLOPS.get(short) or (
                _registry_flops(flop_registry[packet]) if packet in flop_registry else None),
            pass_through=short in _PASS_THROUGH,
            lone_tensor=_lone_tensor(func),
            call=(func._op if type(func).__call__ is OpOverload.__call__
                  and hasattr(func, "_op") else func),
            composite=_composite(func),
        )
        OP_INFO[id(func)] = info
        _KEPT.append(func)
    return info


def _composite(func: Any) -> bool:
    try:
        return torch._C._dispatch_has_kernel_for_dispatch_key(
            func.name(), "CompositeImplicitAutograd")
    except (AttributeError, RuntimeError):  # (not an OpOverload: a HOP, say)
        return False


def register_sync_op(name: str, *, direction: str = "DtoH",
                     nbytes: int | Callable[..., int] = 8, arg: int = 0,
                     trigger: str | None = None) -> None:
    """Declare that the op `name` ("mylib::op", as registered with torch.library) makes the
    host wait inside its device code: it copies `nbytes` (an int, or a function of the op's
    `(args, kwargs, out)`) from its argument number `arg` to the host (direction "DtoH"), or
    from the host into its output ("HtoD"). Each call with that tensor on the device is then
    recorded as a sync copy named `trigger` (the op's own name by default) at the line that
    called the op, on the simulated GPU and on a real one. Takes effect from the op's next
    call, in this process; declaring an op again replaces its rule."""
    SYNC_RULES[name] = declared_rule(name, direction, nbytes, arg, trigger)
    forget(name)


def forget(name: str) -> None:
    """Drop the cached OpInfo of the op `name`: looked up again, with its rule as it is then,
    at its next call."""
    for key, info in list(OP_INFO.items()):
        if info.name == name:
            del OP_INFO[key]


def _lone_tensor(func: Any) -> bool:
    """Whether the first argument of `func`'s schema is a Tensor (not optional, not a list)
    and no other argument can hold one."""
    arguments = getattr(getattr(func, "_schema", None), "arguments", None)
    if not arguments or str(arguments[0].type) != "Tensor":
        return False
    return not any("Tensor" in str(a.type) for a in arguments[1:])


def index_tensors(info: OpInfo, args: tuple) -> list[torch.Tensor]:
    """The index tensors of an indexing op (its second argument, a list with Nones)."""
    if not info.index or len(args) < 2 or not isinstance(args[1], (list, tuple)):
        return []
    return [i for i in args[1] if isinstance(i, torch.Tensor)]


def is_mask(t: torch.Tensor) -> bool:
    return t.dtype in (torch.bool, torch.uint8)


#: Keys into DeviceProfile.peak_flops by dtype; any other dtype is "other".
DTYPE_CLASS: dict[torch.dtype, str] = {
    torch.float64: "float64", torch.float32: "float32", torch.float16: "float16",
    torch.bfloat16: "bfloat16"}


def dtype_class(dtype: torch.dtype) -> str:
    """Key into DeviceProfile.peak_flops."""
    return DTYPE_CLASS.get(dtype, "other")
