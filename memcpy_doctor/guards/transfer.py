"""`transfer_guard`: allow, log or refuse copies between host and GPU in a block, as JAX's
`jax.transfer_guard` does.

    with transfer_guard("disallow"):
        loss = step(batch.cuda())      # explicit: allowed
        print(loss.item())             # implicit: TransferGuardError at this line

Levels, for each copy in the directions the guard names:

- ``allow``: nothing happens;
- ``log``: each copy is logged (logger ``memcpy_doctor.transfer_guard``, WARNING, the record's
  pathname/lineno set to the user's line); unlike JAX's ``log``, explicit copies are logged too;
- ``disallow``: implicit copies raise `TransferGuardError`, explicit ones are allowed;
- ``disallow_explicit``: every copy raises.

Explicit means the user's code names the transfer: the triggers in `EXPLICIT_TRIGGERS`
(`.to()`, `.cuda()`, `.cpu()`, `copy_`, `torch.tensor/as_tensor/asarray/new_tensor` with a
device, and the copies autograd makes in `backward()` for the gradient of such a transfer).
Everything else is implicit: `.item()`, `float/int/bool(t)`, `if t:`, `print`/`repr`/f-strings,
`tolist`, `nonzero`, mask indexing, `unique`, `bincount`, host index tensors, `torch.equal`,
linalg error checks, ... (a trigger added to the tracer later is implicit until listed here).

The guard listens to the copies the tracer records (`Tracer.add_copy_listener`). Inside a
running tracer (`memcpy_doctor.profiler()`), it uses that one. Otherwise it starts a tracer for
the block (`device="auto"`: the real GPU when torch sees one, else the simulated GPU) and stops
it on exit, also on error. On a CPU-only machine the block's cuda tensors are then simulated:
`torch.cuda.is_available()` is True inside, and a "cuda" tensor made there is an ordinary host
tensor after the block. A `profiler()` cannot be opened inside such a block (one tracer at a
time): open the profiler first, then the guard.

A refused copy raises where the tracer records it, in the statement that made it (the
traceback's innermost frame outside torch and memcpy-doctor is the user's line): torch may
already have moved the data, but the statement never completes; the copy is not counted in the
trace.

Nested guards: for each direction the innermost guard that names it wins; directions it does
not name keep the enclosing guard's level (JAX's per-direction guards behave so). Guards are
per thread, like the tracer, which traces only the thread that started it.
"""

from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Mapping
from typing import Any, Callable, Iterable, TypeVar

from ..core.defaults import DEFAULT_DEVICE
from ..core.paths import format_site
from ..core.trace import DIRECTIONS
from ..core.units import format_value

#: The levels, from least to most strict.
LEVELS = ("allow", "log", "disallow", "disallow_explicit")

#: Copy directions, as the tracer names them.

#: Triggers of copies the user's code asks for by name (see the module docstring).
EXPLICIT_TRIGGERS = frozenset({"to", "cuda", "cpu", "copy_", "factory", "backward"})

#: Where `log` writes, and at which level.
logger = logging.getLogger("memcpy_doctor.transfer_guard")
LOG_LEVEL = logging.WARNING

_F = TypeVar("_F", bound=Callable[..., Any])


class TransferGuardError(RuntimeError):
    """A copy between host and GPU that a `transfer_guard` refuses. `event` is the tracer's
    `CopyEvent` (direction, trigger, bytes, shape, dtype, site); `level` the level that
    refused it."""

    def __init__(self, message: str, event: Any = None, level: str | None = None) -> None:
        super().__init__(message)
        self.event = event
        self.level = level


class _Thread(threading.local):
    def __init__(self) -> None:
        self.stack: list[_Entry] = []


_thread = _Thread()


def is_explicit(trigger: str) -> bool:
    """Whether a copy with this trigger is an explicit transfer (see EXPLICIT_TRIGGERS)."""
    return trigger in EXPLICIT_TRIGGERS


def parse_levels(level: str | Mapping[str, str],
                 directions: Iterable[str] | str = DIRECTIONS) -> dict[str, str]:
    """{direction: level} from a level and the directions it applies to, or from a mapping
    such as {"HtoD": "allow", "DtoH": "disallow"}."""
    if isinstance(level, Mapping):
        if directions is not DIRECTIONS and tuple(directions) != DIRECTIONS:
            raise ValueError("transfer_guard: give either a {direction: level} mapping or a "
                             "level and directions, not both")
        pairs = list(level.items())
    else:
        if isinstance(directions, str):
            directions = (directions,)
        directions = tuple(directions)
        if not directions:
            raise ValueError("transfer_guard: directions is empty; name at least one of "
                             + ", ".join(DIRECTIONS))
        pairs = [(d, level) for d in directions]
    levels: dict[str, str] = {}
    for direction, lvl in pairs:
        if direction not in DIRECTIONS:
            raise ValueError(f"transfer_guard: unknown direction {direction!r}; known: "
                             + ", ".join(DIRECTIONS))
        if lvl not in LEVELS:
            raise ValueError(f"transfer_guard: unknown level {lvl!r}; known: "
                             + ", ".join(LEVELS))
        levels[direction] = lvl
    return levels


def describe(event: Any, cwd: str | None = None) -> str:
    """One copy in words: `trigger` direction, sync or not, bytes, dtype and shape, site."""
    kind = "explicit" if is_explicit(event.trigger) else "implicit"
    mode = "sync" if event.sync else "async"
    tensor = ""
    if event.dtype is not None or event.shape is not None:
        shape = "" if event.shape is None else f" of shape {tuple(event.shape)}"
        tensor = f", {event.dtype or 'a'} tensor{shape}"
    return (f"{kind} {event.direction} copy `{event.trigger}` ({mode}), "
            f"{format_value('bytes', event.nbytes)}{tensor} at "
            f"{format_site(event.site, cwd, missing='<no user frame>')}")


def _owner(direction: str) -> _Entry | None:
    """The innermost open guard of this thread that names `direction`."""
    for entry in reversed(_thread.stack):
        if direction in entry.levels:
            return entry
    return None


class _Entry:
    """One open guard block: its levels and the tracer it listens to."""

    __slots__ = ("levels", "tracer", "owned")

    def __init__(self, levels: dict[str, str], tracer: Any, owned: bool) -> None:
        self.levels = levels
        self.tracer = tracer
        self.owned = owned

    def on_copy(self, event: Any) -> None:
        __tracebackhide__ = True  # pytest: show the user's line, not this one
        if _owner(event.direction) is not self:
            return  # an inner guard decides, or this thread has none
        level = self.levels[event.direction]
        if level == "allow":
            return
        if level == "log":
            _log(event)
            return
        if level == "disallow" and is_explicit(event.trigger):
            return
        if level == "disallow":
            why = ("level 'disallow' refuses implicit copies; explicit transfers (.to(), "
                   ".cuda(), .cpu(), copy_(), torch.tensor(..., device=...)) are allowed")
        else:
            why = f"level 'disallow_explicit' refuses every {event.direction} copy"
        raise TransferGuardError(f"transfer_guard: {describe(event)} is not allowed ({why})",
                                 event, level)


def _log(event: Any) -> None:
    if not logger.isEnabledFor(LOG_LEVEL):
        return
    site = event.site
    record = logger.makeRecord(
        logger.name, LOG_LEVEL, site.file if site is not None else "(unknown file)",
        site.line if site is not None else 0, "transfer_guard: %s", (describe(event),), None,
        func=site.function if site is not None else None, extra={"copy_event": event})
    logger.handle(record)


class transfer_guard:  # noqa: N801  (a context manager named like the function it mirrors)
    """Allow, log or refuse host<->GPU copies in a block (see the module docstring).

        with transfer_guard("disallow"): ...
        with transfer_guard("log", directions=("HtoD",)): ...
        with transfer_guard({"HtoD": "allow", "DtoH": "disallow"}): ...

        @transfer_guard("disallow")
        def step(batch): ...

    `device` is used only when no tracer is running and the guard starts its own: "auto"
    (the real GPU if torch sees one, else the simulated one), "cuda" or "sim".
    """

    def __init__(self, level: str | Mapping[str, str],
                 directions: Iterable[str] | str = DIRECTIONS, *,
                 device: str = DEFAULT_DEVICE) -> None:
        self.levels = parse_levels(level, directions)
        self.device = device
        self._entries: list[_Entry] = []

    def __repr__(self) -> str:
        return f"transfer_guard({self.levels!r})"

    def __enter__(self) -> transfer_guard:
        from ..tracer import Tracer, active_tracer
        tracer = active_tracer()
        owned = tracer is None
        if owned:
            tracer = Tracer(device=self.device).start()
        entry = _Entry(dict(self.levels), tracer, owned)
        try:
            tracer.add_copy_listener(entry.on_copy)
        except BaseException:
            if owned:
                tracer.stop()
            raise
        _thread.stack.append(entry)
        self._entries.append(entry)
        return self

    def __exit__(self, *exc: Any) -> None:
        entry = self._entries.pop()
        try:
            stack = _thread.stack
            for i in range(len(stack) - 1, -1, -1):
                if stack[i] is entry:
                    del stack[i]
                    break
            entry.tracer.remove_copy_listener(entry.on_copy)
        finally:
            if entry.owned:
                entry.tracer.stop()

    def __call__(self, func: _F) -> _F:
        """As a decorator: each call runs inside a fresh guard with these levels."""
        levels, device = dict(self.levels), self.device

        @functools.wraps(func)
        def guarded(*args: Any, **kwargs: Any) -> Any:
            with transfer_guard(levels, device=device):
                return func(*args, **kwargs)

        return guarded  # type: ignore[return-value]
