"""`memcpy-doctor profile --ranks N`: start N processes of one distributed run on this machine,
with the environment torchrun gives its workers, and wait for them.

Each child is a plain `memcpy-doctor profile` of the script that finds its rank in the
environment (see rankenv) and writes its own trace. Their stdout and stderr are this
process's, as under torchrun. When a rank fails, the others get `grace_s` seconds to end on
their own (a rank blocked in a collective with the failed one never will), then SIGTERM (which
still writes their traces), then after `grace_s` more, SIGKILL. SIGTERM and SIGHUP sent to
this process are passed on to the ranks. Nothing here prints.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import threading
import time
from dataclasses import dataclass
from typing import Any, Mapping

from ..core.defaults import EXIT_SIGNAL_BASE, HANDLED_SIGNALS, RANKS_GRACE_S

#: How often the ranks are polled, in seconds.
_POLL_S = 0.02


@dataclass(frozen=True)
class RankExit:
    """How one rank's process ended. `status` is as a shell reports it (128+N for a death by
    signal N); `stopped`: ended by the launcher after another rank failed, or on Ctrl-C."""

    rank: int
    status: int
    signal: int | None
    stopped: bool = False


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on `host` now (the OS picks it), for MASTER_PORT."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def rank_environ(base: Mapping[str, str], rank: int, world_size: int, port: int,
                 host: str = "127.0.0.1") -> dict[str, str]:
    """The environment torchrun gives worker `rank` of `world_size` on one machine."""
    env = dict(base)
    env.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world_size),
               LOCAL_WORLD_SIZE=str(world_size), GROUP_RANK="0", ROLE_RANK=str(rank),
               ROLE_WORLD_SIZE=str(world_size), MASTER_ADDR=host, MASTER_PORT=str(port))
    env.setdefault("OMP_NUM_THREADS", "1")  # torchrun's default with several workers
    return env


def _status(returncode: int) -> tuple[int, int | None]:
    if returncode < 0:
        return EXIT_SIGNAL_BASE - returncode, -returncode
    return returncode, None


def worst_status(exits: list[RankExit]) -> int:
    """The exit status for the whole run: the highest of the ranks that ended on their own
    (those the launcher stopped ended because of another), 0 when all succeeded."""
    own = [e.status for e in exits if not e.stopped]
    return max(own, default=0)


def launch(cmd: list[str], world_size: int, environ: Mapping[str, str] | None = None,
           grace_s: float = RANKS_GRACE_S) -> tuple[list[RankExit], bool]:
    """Run `cmd` as ranks 0..world_size-1 and wait for all. Returns each rank's exit, in rank
    order, and whether this process was interrupted (Ctrl-C) meanwhile."""
    base = dict(os.environ if environ is None else environ)
    port = free_port()
    procs = [subprocess.Popen(cmd, env=rank_environ(base, r, world_size, port))
             for r in range(world_size)]
    stopped: set[int] = set()
    interrupted = False

    def signal_all(sig: int) -> None:
        for r, p in enumerate(procs):
            if p.poll() is None:
                try:
                    p.send_signal(sig)
                except OSError:
                    pass

    restore = _forward_signals(signal_all)
    try:
        failed_at: float | None = None
        termed_at: float | None = None
        while True:
            try:
                codes = [p.poll() for p in procs]
                if all(c is not None for c in codes):
                    break
                now = time.monotonic()
                if failed_at is None and any(c not in (None, 0) for c in codes):
                    failed_at = now
                if failed_at is not None and termed_at is None and now - failed_at > grace_s:
                    stopped.update(r for r, c in enumerate(codes) if c is None)
                    signal_all(signal.SIGTERM)
                    termed_at = now
                if termed_at is not None and now - termed_at > grace_s:
                    signal_all(signal.SIGKILL)
                time.sleep(_POLL_S)
            except KeyboardInterrupt:
                # Ctrl-C at a terminal reaches the ranks too (one process group): give them
                # time to write their traces; then pass it on (it was sent here alone).
                interrupted = True
                deadline = time.monotonic() + grace_s
                while time.monotonic() < deadline and any(p.poll() is None for p in procs):
                    time.sleep(_POLL_S)
                stopped.update(r for r, p in enumerate(procs) if p.poll() is None)
                signal_all(signal.SIGINT)
                failed_at = time.monotonic()  # then SIGTERM, then SIGKILL, as for a failure
    finally:
        restore()
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait()
    exits = []
    for r, p in enumerate(procs):
        status, sig = _status(p.returncode)
        exits.append(RankExit(r, status, sig, r in stopped))
    return exits, interrupted


def _forward_signals(forward: Any) -> Any:
    """Pass SIGTERM and SIGHUP on to the ranks while they run (main thread only, where
    Python allows handlers); returns the function that puts the old handlers back."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None
    saved = {}
    for name in HANDLED_SIGNALS:
        sig = getattr(signal, name, None)
        if sig is not None:
            saved[sig] = signal.signal(sig, lambda signum, frame: forward(signum))

    def restore() -> None:
        for sig, old in saved.items():
            signal.signal(sig, old)

    return restore
