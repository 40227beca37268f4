"""The tensors among an op's or a call's arguments and results, found without allocating
where that can be avoided (the per-op path asks on every op)."""

from __future__ import annotations

from typing import Any

import torch

Tensor = torch.Tensor

#: What `untyped_storage()` raises for a tensor without a plain storage (sparse, nested, ...).
NO_STORAGE = (RuntimeError, NotImplementedError, TypeError)

#: The kwargs of an op without any, shared by all such ops (neither torch nor the tracer
#: changes a kwargs dict in place; a read-only mapping would cost 0.14 us each time it is
#: unpacked).
NO_KWARGS: dict = {}


def tensors_in(args: tuple, kwargs: dict) -> list[Tensor]:
    """Tensor arguments, including those inside list arguments (Tensor[] and Tensor?[])."""
    found = []
    for a in args:
        if isinstance(a, Tensor):
            found.append(a)
        elif isinstance(a, (list, tuple)):
            found.extend(b for b in a if isinstance(b, Tensor))
    if kwargs:
        for a in kwargs.values():
            if isinstance(a, Tensor):
                found.append(a)
            elif isinstance(a, (list, tuple)):
                found.extend(b for b in a if isinstance(b, Tensor))
    return found


def tensor_args(args: tuple) -> list[Tensor]:
    """The tensors among an op's positional arguments, including those inside Tensor[] and
    Tensor?[] lists (not int[] lists, such as a view's or a sum's sizes: most lists here)."""
    ins = []
    for a in args:
        if isinstance(a, Tensor):
            ins.append(a)
        elif (a.__class__ is list or a.__class__ is tuple) and a and a[0].__class__ is not int:
            ins += [b for b in a if isinstance(b, Tensor)]
    return ins


def with_kwarg_tensors(ins: tuple | list, kwargs: dict) -> tuple | list:
    """`ins` and the tensors among keyword arguments, if there are any (a new list)."""
    for a in kwargs.values():
        if isinstance(a, Tensor) or a.__class__ is list or a.__class__ is tuple:
            return list(ins) + tensors_in((), kwargs)
    return ins


def names_cuda(device: Any) -> bool:
    """Whether `device` (an op's device argument, or None) is a cuda torch.device."""
    return isinstance(device, torch.device) and device.type == "cuda"


def tensors_out(out: Any) -> list[Tensor]:
    """The tensors an op returned."""
    if isinstance(out, Tensor):
        return [out]
    if isinstance(out, (list, tuple)):
        return [o for o in out if isinstance(o, Tensor)]
    return []


def storage_of(t: Tensor) -> Any:
    """t's untyped storage, or None for a tensor without a plain one (sparse, nested)."""
    try:
        return t.untyped_storage()
    except NO_STORAGE:
        return None
