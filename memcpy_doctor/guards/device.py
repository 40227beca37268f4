"""`device_guard`: run a block's ops, and keep the modules it builds, on one device, as Paddle's
`fluid.device_guard` does (docs/paddle-report.md, "device_guard in Paddle").

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

Cost: the guard is Python code on the host's path, which on a real GPU adds to every step (the
simulated GPU's modeled time leaves it out). On the build machine an empty guard block took
12.3 us and each torch call inside one 2.3 to 10.9 us more (docs/sim-time.md); explain counts
this against the copies a guard edit removes.

Limits: the guard rewrites only calls that reach it first, so open guard blocks inside a
profiler, not around one (a guarded module enters its guard when called, wherever it was
built); a module that registers nothing (`nn.ReLU()`) is not recognised; a guarded module's
own `.to()` is pinned too.

This module is the public surface: `device_guard`, `parse_device` and `guarded_device`. The
per-call rules and the mode that applies them are in guards/device_calls.py; recognising and
pinning modules built under a guard is in guards/device_modules.py.
"""

from __future__ import annotations

import sys
from contextlib import ContextDecorator
from typing import Any

import torch
from .device_calls import _Entry, _GuardMode, _thread
from .device_modules import _frames_from, _hooks, guarded_device

__all__ = ["DEVICE_NAMES", "device_guard", "guarded_device", "parse_device"]

#: The device names device_guard accepts (Paddle's "gpu" means cuda), by the torch type.
DEVICE_NAMES = {"cpu": "cpu", "cuda": "cuda", "gpu": "cuda"}


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


class device_guard(ContextDecorator):  # noqa: N801  (named as Paddle's, used like no_grad)
    """Run the block's torch calls on `device`, and keep the modules it builds there.

    `device` is "cpu", "cuda", "cuda:N", or Paddle's "gpu" / "gpu:N" (cuda); anything else
    raises ValueError. Guards nest, the innermost wins. Also works as a decorator.
    """

    def __init__(self, device: str) -> None:
        self._name = device
        self.device = parse_device(device)
        self._stacks: list[tuple[_Entry, _GuardMode]] = []

    def __repr__(self) -> str:
        return f"device_guard({self._name!r})"

    def _recreate_cm(self) -> device_guard:
        return type(self)(self._name)  # a decorated function's calls each get their own

    def __enter__(self) -> device_guard:
        # (try blocks, not an ExitStack: entry and exit are on the user's path, and with an
        # ExitStack an empty guard block took 20.6 us rather than 12.3 us on the build machine)
        entry = _Entry(self.device, _frames_from(sys._getframe(1)))
        mode = _GuardMode(self.device)
        _hooks.acquire()
        try:
            _thread.entries.append(entry)
            try:
                mode.__enter__()
            except BaseException:
                _thread.entries.remove(entry)
                raise
        except BaseException:
            _hooks.release()
            raise
        self._stacks.append((entry, mode))
        return self

    def __exit__(self, *exc: Any) -> None:
        entry, mode = self._stacks.pop()
        try:
            mode.__exit__(*exc)
        finally:
            try:
                _thread.entries.remove(entry)
            finally:
                _hooks.release()
