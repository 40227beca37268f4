"""The simulated GPU: ordinary host tensors whose storages are marked as living on cuda:0.

A wrapper subclass that claims device cuda on a CPU-only build aborts the process once autograd
touches it, so the data stays in plain host tensors. What makes them "cuda" is a mark on their
storage (kept in a dict keyed by the storage object's id, with weak references so no storage is
kept alive; its core compiled in _marks.c where a C compiler was at install). The function mode
answers `device`, `is_cuda` and `get_device` from the marks and turns `.to("cuda")`, factories
with `device="cuda"` and `pin_memory()` into host work plus marks; the dispatch mode propagates
marks from inputs to outputs and raises the error a real GPU raises when an op mixes devices.
`torch.cuda` answers as a one-GPU machine described by the device profile.
"""

from __future__ import annotations

import weakref
from typing import Any

import torch

from ...core.costmodel import DeviceProfile
from ...core.defaults import PRINT_EDGEITEMS, PRINT_THRESHOLD
from ..tensors import NO_STORAGE
from .streams import (_DEFAULT_STREAM, SimEvent, SimStream, current_stream, set_stream,
                      stream)

CUDA0 = torch.device("cuda", 0)
CPU = torch.device("cpu")




class _StorageRef(weakref.ref):
    """A weak reference to a marked storage, with its key and size (a slotted subclass of
    weakref.ref costs a quarter of a weakref.KeyedRef, whose constructor is Python code)."""

    __slots__ = ("key", "nbytes")


class _PyMarksCore:
    """The marks' table (`refs`: id(storage) to its weak reference), their bytes
    (`allocated`, `peak`), `add_new`, the references' callback `_drop`, and the per-op
    path's two questions, `inputs` and `mark_outputs`. The Python version of `_marks.c`'s
    MarksCore, used where it was not compiled; on the small-op loop the compiled one costs
    about 5,000 instructions an op less (docs/benchmarks.md, "The 2.0x goal met")."""

    __slots__ = ("refs", "allocated", "peak", "_on_free")

    def __init__(self) -> None:
        self.refs: dict[int, _StorageRef] = {}
        self.allocated = 0
        self.peak = 0
        self._on_free = self._drop  # one bound method, not one per reference

    def _drop(self, ref: _StorageRef) -> None:
        refs, key = self.refs, ref.key
        if refs.get(key) is ref:
            del refs[key]
            self.allocated -= ref.nbytes

    def add_new(self, storage: Any, key: int) -> None:
        """Mark a storage known to be unmarked, whose id is `key` (the per-op path has
        looked it up already)."""
        ref = self.refs[key] = _StorageRef(storage, self._on_free)
        ref.key = key
        nbytes = ref.nbytes = storage.nbytes()
        allocated = self.allocated = self.allocated + nbytes
        if allocated > self.peak:
            self.peak = allocated

    def inputs(self, tensors: Any) -> list[bool]:
        """For each tensor, whether its storage is marked (False without a storage): the
        per-op path's question about an op's inputs."""
        refs, out = self.refs, []
        for t in tensors:
            try:
                out.append(id(t.untyped_storage()) in refs)
            except NO_STORAGE:
                out.append(False)  # sparse, nested, storage-less: unmarked
        return out

    def mark_outputs(self, tensors: Any) -> None:
        """Mark the storages of an op's outputs on the device that are not marked yet (new
        ones: not views, not in-place results)."""
        refs = self.refs
        for t in tensors:
            try:
                storage = t.untyped_storage()
            except NO_STORAGE:
                continue  # sparse, nested or storage-less tensors: unmarked
            if (key := id(storage)) not in refs:
                self.add_new(storage, key)


try:
    from ._marks import MarksCore
    COMPILED = True
except ImportError:  # no C compiler where the package was installed
    MarksCore = _PyMarksCore
    COMPILED = False


class StorageMarks(MarksCore):  # type: ignore[misc, valid-type]
    """A set of storages, by identity, that forgets a storage when torch frees it, and the
    bytes of those it holds (what the simulated GPU's memory_allocated() reads)."""

    __slots__ = ()

    def has(self, storage: Any) -> bool:
        return storage is not None and id(storage) in self.refs

    def add(self, storage: Any) -> None:
        if storage is None:
            return
        key = id(storage)
        if key not in self.refs:
            self.add_new(storage, key)

    def discard(self, storage: Any) -> None:
        if storage is None:
            return
        ref = self.refs.get(id(storage))
        if ref is not None:
            self._drop(ref)


def normalize_device(device: Any) -> torch.device | None:
    """A device argument as torch.device; ints mean cuda:N, as in torch."""
    if device is None or isinstance(device, torch.device):
        return device
    if isinstance(device, int):
        return torch.device("cuda", device)
    return torch.device(device)


def is_cuda_device(device: Any) -> bool:
    d = normalize_device(device)
    return d is not None and d.type == "cuda"


def printed_bytes(t: torch.Tensor) -> int:
    """What print(t) reads back to the host: all of t, or its summarized edges."""
    n = t.numel()
    if n > PRINT_THRESHOLD:
        n = 1
        for size in t.shape:
            n *= min(size, 2 * PRINT_EDGEITEMS)
    return n * t.element_size()


class _SimDeviceCtx:
    """torch.cuda.device(...) on the simulated GPU (one device: cuda:0)."""

    def __init__(self, device: Any) -> None:
        self.idx = 0

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: Any) -> bool:
        return False


class _SimDeviceProperties:
    def __init__(self, profile: DeviceProfile) -> None:
        self.name = profile.name
        self.total_memory = profile.total_memory_bytes
        self.major, self.minor = profile.compute_capability
        self.multi_processor_count = profile.multi_processor_count
        self.is_integrated = False
        self.is_multi_gpu_board = False

    def __repr__(self) -> str:
        return (f"_CudaDeviceProperties(name='{self.name}', major={self.major}, "
                f"minor={self.minor}, total_memory={self.total_memory // 2**20}MB, "
                f"multi_processor_count={self.multi_processor_count}) [simulated]")


def _check_device(device: Any = None) -> None:
    d = normalize_device(device)
    if d is not None and (d.type != "cuda" or (d.index or 0) != 0):
        raise RuntimeError("CUDA error: invalid device ordinal (simulated GPU has one device)")


def _exchange_device(device: int) -> int:
    """torch.cuda's device switch: the one device is always the current one."""
    return -1 if device < 0 else 0


def _memory_fraction(fraction: float, device: Any = None) -> None:
    if not 0 <= fraction <= 1:
        raise ValueError(f"Invalid fraction value: {fraction}. Allowed range: 0~1")
    _check_device(device)  # (the simulated allocations are not capped)


def cuda_patches(sim: Any, profile: DeviceProfile) -> dict[str, Any]:
    """Replacements for torch.cuda's device queries, answered as one simulated GPU."""
    marks = sim.cuda_marks


    def memory_allocated(device: Any = None) -> int:
        return marks.allocated

    def max_memory_allocated(device: Any = None) -> int:
        return marks.peak

    def reset_peak(device: Any = None) -> None:
        marks.peak = marks.allocated

    return {
        "is_available": lambda: True,
        "is_initialized": lambda: True,
        "_lazy_init": lambda: None,
        "init": lambda: None,
        "device_count": lambda: 1,
        "current_device": lambda: 0,
        "set_device": _check_device,
        "get_device_name": lambda device=None: profile.name,
        "get_device_properties": lambda device=None: _SimDeviceProperties(profile),
        "get_device_capability": lambda device=None: tuple(profile.compute_capability),
        "is_bf16_supported": lambda including_emulation=True: True,
        "synchronize": lambda device=None: sim.host_wait("synchronize"),
        "set_sync_debug_mode": sim.set_sync_debug_mode,
        "get_sync_debug_mode": lambda: sim.sync_debug,
        "memory_allocated": memory_allocated,
        "max_memory_allocated": max_memory_allocated,
        "memory_reserved": memory_allocated,
        "max_memory_reserved": max_memory_allocated,
        "reset_peak_memory_stats": reset_peak,
        "reset_max_memory_allocated": reset_peak,
        "empty_cache": lambda: None,
        "mem_get_info": lambda device=None: (profile.total_memory_bytes - marks.allocated,
                                             profile.total_memory_bytes),
        "Stream": SimStream,
        "Event": SimEvent,
        "current_stream": current_stream,
        "set_device_index": _check_device,
        "set_device_idx": _check_device,
        "default_stream": lambda device=None: _DEFAULT_STREAM,
        "stream": stream,
        "set_stream": set_stream,
        "device": _SimDeviceCtx,
        # what torch.cuda.device / device_of switch with (a CUDA build of torch without a
        # driver would fail there); the one device is always current
        "_exchange_device": _exchange_device,
        "_maybe_exchange_device": lambda device: _exchange_device(device),
        "is_current_stream_capturing": lambda: False,
        # random numbers "on the device" are drawn from the host's generator: its state is
        # the device's (torch.utils.checkpoint and seeding helpers save and restore it)
        "get_rng_state": lambda device="cuda": torch.get_rng_state(),
        "set_rng_state": lambda new_state, device="cuda": torch.set_rng_state(new_state),
        "get_rng_state_all": lambda: [torch.get_rng_state()],
        "set_rng_state_all": lambda new_states: torch.set_rng_state(new_states[0]),
        "set_per_process_memory_fraction": _memory_fraction,
    }


def memory_stats_patches(sim: Any) -> list[tuple[Any, str, Any]]:
    """torch.cuda.memory_stats (and memory_summary, which reads it) from the simulated
    allocations: allocated and active bytes and their peak; the allocator's other counters,
    which the simulated GPU does not model, read 0."""
    from collections import defaultdict

    from torch.cuda import memory as module

    marks = sim.cuda_marks

    def memory_stats(device: Any = None) -> dict[str, int]:
        stats: dict[str, int] = defaultdict(int, num_alloc_retries=0, num_ooms=0)
        for metric in ("allocated_bytes", "active_bytes", "requested_bytes", "reserved_bytes"):
            for pool in ("all", "large_pool"):
                stats[f"{metric}.{pool}.current"] = marks.allocated
                stats[f"{metric}.{pool}.peak"] = marks.peak
        return stats

    return [(torch.cuda, "memory_stats", memory_stats), (module, "memory_stats", memory_stats)]


def accelerator_patches(sim: Any) -> dict[str, Any]:
    """torch.accelerator answers as one simulated CUDA device too."""
    return {
        "is_available": lambda check_available=True: True,
        "current_accelerator": lambda check_available=False: torch.device("cuda"),
        "device_count": lambda: 1,
        "current_device_index": lambda: 0,
        "current_device_idx": lambda: 0,
        "current_stream": current_stream,
        "set_device_index": _check_device,
        "set_device_idx": _check_device,
        "synchronize": lambda device=None: sim.host_wait("synchronize"),
        "memory_allocated": lambda device=None: sim.cuda_marks.allocated,
        "max_memory_allocated": lambda device=None: sim.cuda_marks.peak,
    }


def pin_memory_patch(sim: Any) -> Any:
    """DataLoader's pin-memory thread pins batches outside the tracer's (thread-local) modes,
    where a CPU-only torch cannot pin: pin them the simulated way there too."""
    from torch.utils.data._utils import pin_memory as module

    original = module.pin_memory

    def pin_memory(data: Any, device: Any = None) -> Any:
        if isinstance(data, torch.Tensor):
            return sim.pin_tensor(data)
        return original(data, device)  # containers: it recurses through this module's name

    return module, "pin_memory", pin_memory
