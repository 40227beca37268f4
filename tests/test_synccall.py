"""What light mode reads from the call at a sync warning's frame (tracer/synccall.py): the kind of
sync and, only where the call cannot do otherwise, its direction; never a guess (issue 41).

Each fake here stands where a tensor would: its method is a C callable (no Python frame of
its own, as a torch binding), or its dunder captures the caller's frame as c10's warning
would find it, on the instruction that synced."""

from __future__ import annotations

import functools
import sys
import warnings

import torch

from memcpy_doctor.core.defaults import LIGHT_SYNC_TRIGGER, SYNC_DEBUG_WARNING
from memcpy_doctor.tracer.light import LightHooks
from memcpy_doctor.tracer.synccall import sync_call

fake_sync = functools.partial(warnings.warn, SYNC_DEBUG_WARNING + " (fake)", UserWarning)
seen: list[tuple[str, str]] = []


class Fake:
    """A tensor's entry points as the warning sees them (C callables: warnings.warn, whose
    arguments limit what a call here can pass)."""

    item = tolist = nonzero = cuda = to = step = staticmethod(fake_sync)

    def __bool__(self) -> bool:
        seen.append(sync_call(sys._getframe(1)))
        return True

    def __getitem__(self, index):
        seen.append(sync_call(sys._getframe(1)))
        return self

    def __setitem__(self, index, value):
        seen.append(sync_call(sys._getframe(1)))

    def __format__(self, spec):
        seen.append(sync_call(sys._getframe(1)))
        return "fake"


def _read(expression) -> tuple[str, str]:
    seen.clear()
    expression()
    (found,) = seen
    return found


def test_truth_subscripts_and_format_are_read_from_the_instruction():
    f = Fake()
    device_mask = torch.ones(2, dtype=torch.bool, device="meta")  # (not on the host)
    host_index = torch.tensor([0, 1])
    unbound = object()

    def truth():
        if f:
            pass

    assert _read(truth) == ("bool", "DtoH")
    assert _read(lambda: not f) == ("bool", "DtoH")
    assert _read(lambda: f[device_mask]) == ("mask", "DtoH")
    assert _read(lambda: f[host_index]) == ("index", "HtoD")
    assert _read(lambda: f[[0, 1]]) == ("index", "HtoD")
    assert _read(lambda: f[unbound]) == ("index", "unknown")

    def store():
        f[device_mask] = 0

    assert _read(store) == ("mask", "DtoH")
    assert _read(lambda: f"{f}") == ("format", "DtoH")


def test_calls_are_named_and_only_reads_and_cuda_get_a_direction():
    f = Fake()
    with LightHooks() as hooks:
        f.item()
        f.nonzero()
        f.cuda()
        f.to()
        f.step(
            stacklevel=1)
        fake_sync()
    hooks.collector.finish()
    found = sorted((c.trigger, c.direction) for c in hooks.collector.copy_records())
    assert found == [("cuda", "HtoD"), ("fake_sync", "unknown"), ("item", "DtoH"),
                     ("nonzero", "DtoH"), ("step", "unknown"), ("to", "unknown")]


def test_a_frame_without_source_says_nothing_it_cannot_know():
    namespace = {"f": Fake()}
    code = compile("f.item()", "<no source>", "exec")
    with LightHooks() as hooks:
        exec(code, namespace)
    hooks.collector.finish()
    [record] = hooks.collector.copy_records()
    assert (record.trigger, record.direction) == (LIGHT_SYNC_TRIGGER, "unknown")


def test_a_sync_inside_torchs_printing_is_print():
    """A sync whose innermost frames are torch's, one of them _tensor_str.py (print, repr,
    str, an f-string of a tensor), is `print`, DtoH: here a frame compiled as that file."""
    import torch._tensor_str as tensor_str

    captured = []

    def formatter():
        captured.append(sync_call(sys._getframe(1)))

    eval(compile("formatter()", tensor_str.__file__, "eval"), {"formatter": formatter})
    assert captured == [("print", "DtoH")]
