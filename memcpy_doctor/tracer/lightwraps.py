"""Light mode's wrapped Python entry points: the syncs users make most, timed, with their kind.

Sync-debug mode's warning names neither the copy's direction nor its size, and comes after
the call has returned, too late to time it; and it does not fire at all for a
`non_blocking=True` copy between the device and pageable memory, which blocks all the same
(Copy.cu). So on a real GPU light mode wraps the Python entry points of the common syncs,
`.to()`, `.cuda()`, `copy_`, `.cpu()`, `.item()`, `.tolist()`, `bool`, `float`, `int` and
`nonzero`: a call that crosses between host and device and makes the host wait is recorded
with its direction, kind, size and wall time, its own sync warning not counted again; any
other call goes straight on after a look at its arguments (an `is_cuda`, a device name).
No op inside PyTorch is wrapped: ops that do not sync cost nothing.
"""

from __future__ import annotations

import sys
import threading
from typing import Any, Callable

import torch

from .syncpoints import COUNT_BYTES

_getframe = sys._getframe
_get_ident = threading.get_ident
_Tensor = torch.Tensor
_dtype = torch.dtype

#: The reads wrapped on a real GPU: (owner, attribute, the copy's trigger, its bytes: None
#: for the tensor's own, else a count read back).
READS = ((_Tensor, "item", "item", None), (_Tensor, "tolist", "tolist", None),
         (_Tensor, "cpu", "cpu", None), (_Tensor, "__bool__", "bool", None),
         (_Tensor, "__float__", "float", None), (_Tensor, "__int__", "int", None),
         (_Tensor, "nonzero", "nonzero", COUNT_BYTES), (torch, "nonzero", "nonzero", COUNT_BYTES))


class LightWrappers:
    """The wrappers of LightHooks (which has `quiet`, `timed_call`, `copy` and `wait`)."""

    quiet: set[int]

    def timed(self, kind: str, original: Callable) -> Callable:
        """`original` (a host wait), recorded with its wall time at its caller's site; a
        sync warning inside it is its own, not counted again."""
        quiet = self.quiet

        def wrapper(*args: Any, **kwargs: Any) -> Any:
            ident = _get_ident()
            if ident in quiet:
                return original(*args, **kwargs)
            result, ns = self.timed_call(ident, original, args, kwargs)
            self.wait(kind, ns, _getframe(1))
            return result

        wrapper.__wrapped__ = original
        return wrapper

    def copy_wrapper(self, original: Callable) -> Callable:
        """Tensor.copy_ between the device and host memory: recorded unless it is the one
        async kind (non_blocking=True with pinned host memory); blocking, or non_blocking
        with pageable memory (cudaMemcpyAsync returns only once such a copy is done or, to
        the device, staged; sync-debug mode does not flag that one: Copy.cu), the host
        waits. Any other call goes straight on."""
        quiet = self.quiet

        def copy_(dst: Any, *args: Any, **kwargs: Any) -> Any:
            src = args[0] if args else kwargs.get("src")
            ident = _get_ident()
            if ident in quiet or not isinstance(src, _Tensor) or src.is_cuda == dst.is_cuda:
                return original(dst, *args, **kwargs)
            non_blocking = bool(args[1] if len(args) > 1 else kwargs.get("non_blocking"))
            host = dst if src.is_cuda else src
            if host.device.type != "cpu" or non_blocking and host.is_pinned():
                return original(dst, *args, **kwargs)
            pinned = host.is_pinned()
            result, ns = self.timed_call(ident, original, (dst, *args), kwargs)
            self.copy(src, ns, _getframe(1), "DtoH" if src.is_cuda else "HtoD", "copy_",
                      non_blocking=non_blocking, pinned=pinned)
            return result

        copy_.__wrapped__ = original
        return copy_

    def to_wrapper(self, original: Callable, trigger: str) -> Callable:
        """Tensor.to or Tensor.cuda (`trigger`) between host memory and the device: recorded
        unless async (non_blocking=True from pinned memory to the device, or to the host,
        where torch copies into pinned memory it allocates); any other call (a dtype, the
        same device) goes straight on after a look at its arguments."""
        quiet = self.quiet

        def to(t: Any, *args: Any, **kwargs: Any) -> Any:
            if args and type(args[0]) is _dtype and "device" not in kwargs:
                return original(t, *args, **kwargs)  # (the commonest call: a dtype)
            ident = _get_ident()
            if ident in quiet:
                return original(t, *args, **kwargs)
            place, non_blocking = _target(trigger, args, kwargs)
            if place == "cuda":
                if t.is_cuda or t.device.type != "cpu" or non_blocking and t.is_pinned():
                    return original(t, *args, **kwargs)
                direction = "HtoD"
            elif place == "cpu" and t.is_cuda and not non_blocking:
                direction = "DtoH"
            else:
                return original(t, *args, **kwargs)
            pinned = direction == "HtoD" and t.is_pinned()
            result, ns = self.timed_call(ident, original, (t, *args), kwargs)
            if result is not t and t.nbytes:  # (torch skips an empty tensor's copy)
                self.copy(t, ns, _getframe(1), direction, trigger,
                          non_blocking=non_blocking, pinned=pinned)
            return result

        to.__wrapped__ = original
        return to

    def read_wrapper(self, original: Callable, trigger: str,
                     nbytes: int | None = None) -> Callable:
        """A Python entry point that reads a tensor back to the host (`item`, `nonzero`,
        ...: `trigger`): on a device tensor, a DtoH sync copy of its bytes (or `nbytes`, a
        count's), timed by the wall clock, its sync warning the call's own; any other call
        goes straight on, after one look at `is_cuda`."""
        quiet = self.quiet

        def read(t: Any, *args: Any, **kwargs: Any) -> Any:
            ident = _get_ident()
            if ident in quiet or not getattr(t, "is_cuda", False):
                return original(t, *args, **kwargs)
            result, ns = self.timed_call(ident, original, (t, *args), kwargs)
            self.copy(t, ns, _getframe(1), "DtoH", trigger, non_blocking=False,
                      nbytes=nbytes)
            return result

        read.__wrapped__ = original
        return read

    def read_patches(self) -> list[tuple[Any, str, Any]]:
        return [(owner, name, self.read_wrapper(getattr(owner, name), trigger, nbytes))
                for owner, name, trigger, nbytes in READS]


def _target(trigger: str, args: tuple, kwargs: dict) -> tuple[str | None, bool]:
    """Where a `.cuda(...)` or `.to(...)` call sends its tensor ("cuda", "cpu", or None: a
    dtype, another device kind) and whether it asked non_blocking. Tensor.to's forms are
    (device, dtype, non_blocking, copy), (other, non_blocking, copy) and (dtype,
    non_blocking, copy); Tensor.cuda's (device, non_blocking)."""
    if trigger == "cuda":
        return "cuda", bool(kwargs.get("non_blocking") or (len(args) > 1 and args[1]))
    target = kwargs.get("device", args[0] if args else kwargs.get("other"))
    at = 2
    if isinstance(target, _Tensor):
        at, place = 1, "cuda" if target.is_cuda else target.device.type
    elif isinstance(target, str):
        place = target.split(":", 1)[0]
    elif isinstance(target, torch.device):
        place = target.type
    elif isinstance(target, int) and not isinstance(target, bool):
        place = "cuda"  # a device ordinal is a GPU's
    else:
        return None, False  # a dtype: the tensor stays where it is
    if place not in ("cuda", "cpu"):
        return None, False
    return place, bool(kwargs.get("non_blocking", args[at] if len(args) > at else False))
