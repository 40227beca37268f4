"""The per-op path's last step, for the few ops that read device data on the host inside
their own code (`OpInfo.reads`): the copies they make the host wait for, recorded at the
op's site. `item()`, `nonzero`, a masked index and the rest follow their rules in
tracer/syncpoints.py; an index op reads its mask or sends its host index over; the reads
a backward formula will make are kept until a backward pass (tracer/backward.py)."""

from __future__ import annotations

from typing import Any

import torch

from .backward import pend
from .optable import SCALAR_TRIGGERS, OpInfo, index_tensors, is_mask
from .syncpoints import COUNT_BYTES

Tensor = torch.Tensor


def after_op(ctx: Any, info: OpInfo, args: tuple, kwargs: dict, out: Any, site: Any,
             measured_ns: int) -> None:
    """The copies an op with device inputs makes inside its own code, in the thread context
    `ctx` (tracer/context.py). `measured_ns`: on a real GPU, the time of the op's first
    copy (the op's own when it is the copy, or the wait CUDA reported inside it)."""
    sync = info.sync
    if sync is not None and not ctx.cpu_only_checks:
        trigger = sync.trigger
        if info.short == "_local_scalar_dense" and ctx.trigger in SCALAR_TRIGGERS:
            trigger = ctx.trigger
        on_device = ctx.on_device
        for direction, tensor, nbytes in sync.reads(args, kwargs, out):
            if on_device(tensor):
                ctx.sync_copy(direction, trigger, nbytes, tensor, site, measured_ns)
                measured_ns = 0
    elif info.index:
        _index_copies(ctx, info, args, kwargs, site, measured_ns)
    if info.backward is not None:
        pend(ctx, info.backward, args, kwargs, out)


def _index_copies(ctx: Any, info: OpInfo, args: tuple, kwargs: dict, site: Any,
                  measured_ns: int) -> None:
    """Indexing a device tensor: a device mask is counted on the host (DtoH); a host index
    tensor is copied to the device first (HtoD), and so is a 0-dim host value assigned
    (`t[idx] = 5.0`). `t[mask] = scalar` copies nothing: PyTorch hands a lone device mask
    with a one-element host value to `masked_fill_`."""
    on_device = ctx.on_device
    if not on_device(args[0]):
        return
    indices = index_tensors(info, args)
    if info.short != "index":  # an assignment: `t[indices] = value`
        value = args[2] if len(args) > 2 else kwargs.get("values")
        host_scalar = (isinstance(value, Tensor) and value.numel() == 1
                       and not on_device(value))
        accumulate = args[3] if len(args) > 3 else kwargs.get("accumulate", False)
        if (host_scalar and not accumulate and len(indices) == 1 and is_mask(indices[0])
                and on_device(indices[0])):
            return  # masked_fill_ with the value read on the host: no copy
        if host_scalar and value.dim() == 0:  # sent over first: value.to(self.device())
            ctx.sync_copy("HtoD", "index", value.nbytes, value, site, measured_ns)
            measured_ns = 0
    for idx in indices:
        if on_device(idx):
            if is_mask(idx):
                ctx.sync_copy("DtoH", "mask", COUNT_BYTES, idx, site, measured_ns)
                measured_ns = 0
        elif is_mask(idx):  # a host mask: its positions, found on the host into pinned
            # memory, go over with non_blocking (IndexingUtils.h; PyTorch's test_sync_warning
            # expects no sync): an async copy of an int64 row per dimension per position
            ctx.async_copy("HtoD", "index", int(idx.sum()) * idx.dim() * 8, idx, site)
        elif idx.dim() >= 1:
            ctx.sync_copy("HtoD", "index", idx.nbytes, idx, site, measured_ns)
            measured_ns = 0
