"""The host reads of backward formulas, which PyTorch skips under any dispatch mode.

Some backward formulas read device values on the host: `prod_backward`'s
`(input == 0).nonzero()`, `cumprod_backward`'s `is_zero.any().item()`, `masked_fill_backward`'s
`masked_select` (torch/csrc/autograd/FunctionsManual.cpp, aten/src/ATen/native/ReduceOps.cpp).
Each first asks `areAnyTensorSubclassLike`, which is true whenever a TorchDispatchMode is
active (`c10::impl::dispatch_mode_enabled()`, ATen/TensorSubclassLikeUtils.h), and then takes a
composite path that reads nothing. Under the tracer's own dispatch mode the read is therefore
never made, on the simulated GPU or on a real one, while the program run without the tracer
makes it: the tracer records the read the program makes.

A forward op with a rule (syncpoints.BACKWARD_RULES) leaves its reads here (`pend`), with
its output: autograd attaches the op's node to the output only after the dispatch mode
returns. When the torch call that made it returns to the function mode (tracer/modes.py),
at the next such op, or when a backward pass starts (`torch.autograd._engine_run_backward`,
wrapped while tracing), the reads are armed as a pre-hook on that node and the output let go
(an output is held no longer than the call that made it, and the hook keeps nothing the node
does not); they are recorded each time autograd runs the node, at the backward() call's
line.
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from ..core.torch_private import dynamo_skip_frame
from .syncpoints import Read, SyncRule


def pend(state: Any, rule: SyncRule, args: tuple, kwargs: dict, out: Any) -> None:
    """Keep the reads the backward of this forward call will make, until its node exists."""
    if not isinstance(out, torch.Tensor) or not torch.is_grad_enabled():
        return
    reads = rule.reads(args, kwargs, out)
    if not reads:
        return
    pending = state.backward_pending
    if pending:  # an earlier op's node is attached by now
        arm(pending)
    pending.append((state, out, rule.trigger, reads))


def arm(pending: list) -> None:
    """Hook each pending read onto its output's autograd node (none: nothing will run it)."""
    entries = pending[:]
    pending.clear()
    for state, out, trigger, reads in entries:
        node = out.grad_fn
        if node is not None:
            node.register_prehook(_reader(state, trigger, reads))


def _reader(state: Any, trigger: str, reads: list[Read]) -> Callable[..., None]:
    def read(grad_outputs: Any) -> None:
        if state.suspended:
            return
        site = state.here()  # (the backward() call's line, above the engine or beside it)
        for direction, tensor, nbytes in reads:
            if state.on_device(tensor):
                state.gap()
                state.sync_copy(direction, trigger, nbytes, tensor, site, 0)

    return read


def engine_patches(state_of: Callable[[], Any]) -> list[tuple[Any, str, Any]]:
    """`torch.autograd._engine_run_backward` (what backward() and autograd.grad() call),
    arming the pending reads of the calling thread's state first. On a torch without it,
    none: reads are then armed at the next forward op with a rule only."""
    original = getattr(torch.autograd, "_engine_run_backward", None)
    if original is None:
        return []

    def run_backward(*args: Any, **kwargs: Any) -> Any:
        pending = state_of().backward_pending
        if pending:
            arm(pending)
        return original(*args, **kwargs)

    dynamo_skip_frame(run_backward.__code__)
    return [(torch.autograd, "_engine_run_backward", run_backward)]
