"""Where torch's own code asks about devices below the function mode, answered as a GPU would.

The simulated device lives in marks on host storages (marks.py). Calls into C++ that group
tensors by device, the serializer's storage tags and restores, and CPU-only checks inside
composite ops do not go through `Tensor.device`, so they would see the host; and CUDA code
reaches some of what a CPU build of torch lacks (NVTX, DataParallel's scatter) without asking
torch.cuda. Each piece here makes one of them behave as on a one-GPU machine, for the
tracer's run only: the patches are undone on exit with the rest (tracer/__init__.py).
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Callable, Iterator

import torch

from ..backward import engine_patches
from .marks import CUDA0


class _NoNvtx:
    """torch.cuda.nvtx's ranges and marks on the simulated GPU: no profiler to annotate."""

    def __getattr__(self, name: str) -> Any:
        return lambda *args, **kwargs: 0


def _data_parallel_scatter(module: Any, inputs: Any, kwargs: Any, device_ids: Any) -> tuple:
    """DataParallel.scatter over the one simulated device: the inputs, each tensor copied over
    if it is on the host (a CPU build of torch has no torch._C._scatter)."""
    from torch.utils._pytree import tree_map_only

    if [int(d) for d in device_ids] != [0]:
        raise RuntimeError("CUDA error: invalid device ordinal (the simulated GPU has one "
                           "device, cuda:0)")

    def move(obj: Any) -> Any:
        return tree_map_only(torch.Tensor, lambda t: t.to(CUDA0), obj)

    return (move(tuple(inputs)),), (move(dict(kwargs or {})),)


def torch_patches(sim: Any) -> list[tuple[Any, str, Any]]:
    """The attributes of torch this module replaces for the run (applied and undone by the
    tracer with the rest): grouping by device, cuDNN's check, the generator class, the
    backward engine's entry (where backward formulas' reads are armed: tracer/backward.py),
    NVTX ranges, DataParallel's scatter. (Serialization has its own context:
    `serialization`.)"""
    from torch.cuda import nvtx
    return [group_by_device_patch(sim), cudnn_patch(), generator_patch(),
            (nvtx, "_nvtx", _NoNvtx()),
            (torch.nn.DataParallel, "scatter", _data_parallel_scatter),
            save_on_cpu_patch(sim), *engine_patches(lambda: sim.st)]


def save_on_cpu_patch(sim: Any) -> tuple[Any, str, Callable[..., Any]]:
    """`torch.autograd.graph.save_on_cpu`: its pack hook runs below the function mode, where
    `tensor.device` of a device tensor answers cpu, so the unpack hook would send it back to
    the host, not the device. The same hooks, with the device the simulated GPU answers (its
    `torch.empty(..., pin_memory=True)` is the per-op path's, perop._pinned)."""
    cls = torch.autograd.graph.save_on_cpu
    original = cls.__init__

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        pack = self.pack_hook

        def pack_on_device(tensor: torch.Tensor) -> Any:
            device, packed = pack(tensor)
            return (CUDA0 if sim.on_device(tensor) else device), packed
        self.pack_hook = pack_on_device

    return cls, "__init__", __init__


def group_by_device_patch(sim: Any) -> tuple[Any, str, Callable[..., Any]]:
    """`torch._C._group_tensors_by_device_and_dtype` (what foreach optimizers and clip_grad
    group parameters with) keyed by the simulated device: a group of device tensors is keyed
    cuda:0, so `t.to(device)` of a group's result stays on the device as it does on a GPU."""
    original = torch._C._group_tensors_by_device_and_dtype
    on_device = sim.on_device

    def group(tensorlistlist: Any, with_indices: bool = False) -> dict:
        grouped = original(tensorlistlist, with_indices)
        out: dict = {}
        for (device, dtype), (lists, indices) in grouped.items():
            firsts = lists[0]
            flags = [t is not None and on_device(t) for t in firsts]
            if device.type != "cpu" or not any(flags):
                out[(device, dtype)] = (lists, indices)
                continue
            for key, keep in (((CUDA0, dtype), True), ((device, dtype), False)):
                picked = [j for j, flag in enumerate(flags) if flag is keep]
                if picked:
                    out[key] = ([[lst[j] for j in picked] if lst else lst for lst in lists],
                                [indices[j] for j in picked] if indices else indices)
        return out

    return torch._C, "_group_tensors_by_device_and_dtype", group


def cudnn_patch() -> tuple[Any, str, Callable[..., Any]]:
    """`torch.backends.cudnn.is_acceptable` says no: a simulated device tensor runs the host's
    kernels, never cuDNN's (which a CUDA build of torch would try, without a GPU, from
    `RNN.flatten_parameters`; a CPU build would warn that it has no cuDNN)."""
    return torch.backends.cudnn, "is_acceptable", lambda tensor: False


class _AnyGenerator(type(torch._C.Generator)):
    """The simulated generator class's type: every torch generator is an instance of it, as
    of `torch.Generator`, whatever made it (and when)."""

    def __instancecheck__(cls, obj: Any) -> bool:
        return isinstance(obj, _HOST_GENERATOR)


_HOST_GENERATOR = torch._C.Generator


class SimGenerator(_HOST_GENERATOR, metaclass=_AnyGenerator):
    """`torch.Generator(device="cuda")` on the simulated GPU: a host generator (the device's
    random numbers are drawn on the host) that says it is on cuda:0."""

    def __new__(cls, device: Any = "cpu") -> Any:
        on_device = torch.device(device).type == "cuda" if device is not None else False
        generator = super().__new__(cls, "cpu")
        generator._memcpy_doctor_cuda = on_device
        return generator

    @property
    def device(self) -> torch.device:  # type: ignore[override]
        return CUDA0 if self._memcpy_doctor_cuda else _HOST_GENERATOR.device.__get__(self)


def generator_patch() -> tuple[Any, str, Any]:
    """`torch.Generator` is SimGenerator while the tracer runs (a CPU build of torch has no
    CUDA generator to make)."""
    return torch, "Generator", SimGenerator


@contextmanager
def serialization(sim: Any) -> Iterator[None]:
    """torch.save tags a device tensor's storage "cuda:0" and copies it to the host (a DtoH
    copy, recorded as `save`); torch.load restores a storage tagged or mapped to "cuda" onto
    the device (an HtoD copy, recorded as `load`), where a CPU-only torch would fail."""
    from torch import serialization as ser

    def tag(storage: Any) -> str | None:
        untyped = getattr(storage, "_untyped_storage", storage)
        if not sim.cuda_marks.has(untyped):
            return None  # the next taggers decide (the host's says "cpu")
        sim.storage_copy("DtoH", untyped, "save")
        return "cuda:0"

    def restore(storage: Any, location: str) -> Any:
        if not location.startswith("cuda"):
            return None
        index = location.partition(":")[2]
        if index and int(index) != 0:
            raise RuntimeError(f"Attempting to deserialize object on CUDA device {index} but "
                               "torch.cuda.device_count() is 1 (the simulated GPU). Please "
                               "use torch.load with map_location to map your storages to an "
                               "existing device.")
        untyped = getattr(storage, "_untyped_storage", storage)
        sim.cuda_marks.add(untyped)
        sim.storage_copy("HtoD", untyped, "load")
        return storage

    entry = (-1, tag, restore)  # before the host's own tagger, which would say "cpu"
    ser._package_registry.insert(0, entry)
    try:
        yield
    finally:
        if entry in ser._package_registry:
            ser._package_registry.remove(entry)


def call_on_device(sim: Any, func: Any, args: tuple, kwargs: dict) -> Any:
    """Run a handled call as the function mode runs one: an op inside it with no tensor
    inputs (a factory in C++ code) is on the device if the call's arguments are."""
    st = sim.st
    prev, st.call_args = st.call_args, (args, kwargs)
    try:
        return func(*args, **kwargs)
    finally:
        st.call_args = prev


def one_hot_handler(sim: Any) -> Callable[..., Any]:
    """F.one_hot of a device tensor: the CPU kernel's range check (a read of the minimum and
    maximum) is one PyTorch runs for CPU tensors only; without `num_classes` a GPU reads the
    maximum, recorded as `item`."""

    def one_hot(func: Any, args: tuple, kwargs: dict) -> Any:
        x = args[0] if args else kwargs.get("input")
        if not isinstance(x, torch.Tensor) or not sim.on_device(x):
            return func(*args, **kwargs)
        classes = args[1] if len(args) > 1 else kwargs.get("num_classes", -1)
        st = sim.st
        if classes is None or classes < 0:
            sim.read_back(x, "item", 8)  # (a GPU reads it with item(), so named)
        st.cpu_only_checks += 1
        try:
            return call_on_device(sim, func, args, kwargs)
        finally:
            st.cpu_only_checks -= 1

    return one_hot


def tensors_in_data(data: Any) -> list[torch.Tensor]:
    """The tensors inside a factory's nested list data (`torch.tensor([a, b])`), looked for
    only where the first leaf is one: a list of Python numbers costs one walk down."""
    probe = data
    while isinstance(probe, (list, tuple)) and probe:
        probe = probe[0]
    if not isinstance(probe, torch.Tensor):
        return []
    found: list[torch.Tensor] = []
    stack = [data]
    while stack:
        item = stack.pop()
        if isinstance(item, torch.Tensor):
            found.append(item)
        elif isinstance(item, (list, tuple)):
            stack.extend(reversed(item))
    return found


def host_outputs_handler(sim: Any, indices: tuple[int, ...]) -> Callable[..., Any]:
    """A call some of whose outputs PyTorch keeps on the host whatever the device of its
    inputs (a packed sequence's batch sizes, a padded one's lengths): they are unmarked."""

    def call(func: Any, args: tuple, kwargs: dict) -> Any:
        out = call_on_device(sim, func, args, kwargs)
        for i in indices:
            sim.cuda_marks.discard(out[i].untyped_storage())
        return out

    return call


def host_factory_handler(sim: Any) -> Callable[..., Any]:
    """torch.linspace / logspace: the result is made where `device` says (the host when it is
    not given), never where the 0-dim tensor ends are: PyTorch reads those with item() and
    calls the number overload (TensorFactories.cpp), the reads recorded by their rules
    (tracer/syncpoints.py)."""

    def call(func: Any, args: tuple, kwargs: dict) -> Any:
        if "device" in kwargs or kwargs.get("pin_memory"):
            return sim.factory(func, args, kwargs)
        st = sim.st
        prev, st.forced = st.forced, False
        try:
            return func(*args, **kwargs)
        finally:
            st.forced = prev

    return call


def ctc_loss_handler(sim: Any) -> Callable[..., Any]:
    """F.ctc_loss with device log-probs: length tensors on the device are read to the host
    (`ctc_loss`, one copy each), as PyTorch's CUDA path does before it runs on lists of
    lengths; it runs on those lists here too, as on a GPU."""

    def ctc_loss(func: Any, args: tuple, kwargs: dict) -> Any:
        args = list(args)
        if not args or not sim.on_device(args[0]):
            return func(*args, **kwargs)
        for i, name in ((2, "input_lengths"), (3, "target_lengths")):
            lengths = args[i] if len(args) > i else kwargs.get(name)
            if not isinstance(lengths, torch.Tensor):
                continue
            if sim.on_device(lengths):
                sim.read_back(lengths, "ctc_loss", lengths.nbytes)
            with sim.suspended(), torch._C.DisableTorchFunction():
                values = tuple(lengths.tolist())
            if len(args) > i:
                args[i] = values
            else:
                kwargs = {**kwargs, name: values}
        return call_on_device(sim, func, tuple(args), kwargs)

    return ctc_loss

