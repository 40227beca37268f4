"""The one import point for PyTorch's private modules, so that an upgrade touches one file.
tests/test_torch_private.py checks each private API the package uses, here or in place."""

import importlib
import re
from typing import Any

import torch

#: The oldest torch release the full test suite passed on; pyproject.toml claims the same.
#: 2.4.1 fails (no torch.accelerator; its torch._dynamo refuses the simulated GPU's Event
#: class); 2.5 was not tried.
OLDEST_TORCH = (2, 6)


def check_torch_version(version: str) -> None:
    """ImportError, in one line, for a torch older than OLDEST_TORCH, rather than a missing
    private name further down."""
    found = re.match(r"(\d+)\.(\d+)", version)
    if found and tuple(map(int, found.groups())) < OLDEST_TORCH:
        raise ImportError(f"memcpy-doctor needs torch {OLDEST_TORCH[0]}.{OLDEST_TORCH[1]} or "
                          f"newer; this is torch {version}")


check_torch_version(torch.__version__)

# (imported after the check: with an older torch, the first of these fails unclearly)
from torch._C._dynamo.eval_frame import set_eval_frame
from torch._C._nn import _parse_to
from torch.overrides import TorchFunctionMode, _get_current_function_mode_stack
from torch.utils._device import DeviceContext, _device_constructors
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes
from torch.utils.flop_counter import flop_registry

try:  # the Python frame from which the autograd engine runs a backward pass
    from torch.autograd.graph import _engine_run_backward
    ENGINE_RUN_BACKWARD = _engine_run_backward.__code__
except (ImportError, AttributeError):  # another torch: ops in backward walk the stack
    ENGINE_RUN_BACKWARD = None


def _storage_object_id(t: torch.Tensor) -> int:
    return id(t.untyped_storage())


#: The address of a tensor's StorageImpl (the same for every view of it, reused once it is
#: freed), read without making the storage's Python object, as `untyped_storage()` does for a
#: storage no Python code has asked for yet; a torch without it: the Python object's id.
storage_id = getattr(torch._C, "_storage_id", None) or _storage_object_id


def dynamo_skip_frame(code) -> None:
    """Have torch.compile's frame evaluation run this code object as it is, never compile
    it (torch._dynamo.skip, for a code object; imports torch._dynamo, about 1.5 s the
    first time)."""
    from torch._dynamo.eval_frame import skip_code

    skip_code(code)


def default_device_type() -> str:
    """The type of torch's default device (torch.set_default_device / `with torch.device`),
    read without creating a tensor, which torch.get_default_device() does. Cheap in the
    common case: no function mode on the stack (the caller's own mode is off while it runs)
    and no global default device."""
    if torch._C._len_torch_function_stack():
        for mode in reversed(_get_current_function_mode_stack()):
            if isinstance(mode, DeviceContext):
                return mode.device.type
    context = getattr(torch._GLOBAL_DEVICE_CONTEXT, "device_context", None)
    return context.device.type if context is not None else "cpu"


__all__ = ["ENGINE_RUN_BACKWARD", "OLDEST_TORCH", "check_torch_version", "default_device_type",
           "dynamo_skip_frame", "storage_id",
           "_device_constructors",
           "TorchDispatchMode", "TorchFunctionMode", "_disable_current_modes", "_parse_to",
           "flop_registry", "set_eval_frame"]

try:  # CUDA's own synchronization callbacks, below the dispatcher (tracer/cuda_hooks.py)
    import torch.cuda._gpu_trace as gpu_trace
except ImportError:  # pragma: no cover - a torch without them: the hooks are off
    gpu_trace = None
__all__ += ["gpu_trace"]


class CompileHooks:
    """What tracer/compiled.py needs of torch.compile's private parts, in one place: Dynamo's
    OutputGraph (whose `call_user_compiler` hands each graph to the backend), the list of graph
    breaks it appends to, its compile start and end callbacks, the id of the compile now
    running, its counters of graph-break messages, and AOT autograd's runtime module."""

    def __init__(self) -> None:
        import torch._dynamo
        from torch._dynamo import eval_frame, output_graph
        from torch._dynamo.utils import counters
        from torch._functorch._aot_autograd import runtime_wrappers
        from torch._guards import CompileContext

        handler = torch._dynamo.callback_handler
        self.output_graph = output_graph.OutputGraph
        self.graph_break_reasons = output_graph.graph_break_reasons
        self.on_start, self.on_end = (handler.register_start_callback,
                                      handler.register_end_callback)
        self.remove_start, self.remove_end = (handler.remove_start_callback,
                                              handler.remove_end_callback)
        self.compile_id = CompileContext.current_compile_id
        self._counters = counters
        self.skip_frame = dynamo_skip_frame
        #: the module whose `call_func_at_runtime_with_args` runs a compiled backward
        self.aot_runtime = runtime_wrappers
        #: what a `torch._dynamo.disable` wrapper (the backend's compiled graph is one)
        #: calls: the graph itself, for a caller already inside such a wrapper
        self.innermost = eval_frame.innermost_fn

    @staticmethod
    def cudagraph_skip_loggers() -> list[Any]:
        """The modules that call Inductor's `log_cudagraph_skip_and_bump_counter` by that
        name (each imported it), for a wrapper to hear each reason CUDA graphs were skipped
        (mode="reduce-overhead"); importing them costs nothing more once Inductor compiles."""
        found = []
        for name in ("torch._inductor.output_code", "torch._inductor.cudagraph_trees"):
            try:
                module = importlib.import_module(name)
            except Exception:  # noqa: BLE001 - an Inductor that cannot import here (no
                continue  # triton, another layout): no skip is heard
            if hasattr(module, "log_cudagraph_skip_and_bump_counter"):
                found.append(module)
        return found

    def cudagraph_skips(self) -> int:
        """Inductor's count of graphs it ran without CUDA graphs (it counts some it does
        not log: CPU graphs under mode="reduce-overhead")."""
        return int(self._counters["inductor"].get("cudagraph_skips", 0))

    def full_message(self, text: str) -> str:
        """The whole graph-break message Dynamo counted of one it cut short in its reason
        (`text` itself when it counted none that starts so)."""
        head = text.strip()[:200]
        for message in self._counters.get("graph_break", {}):
            if head and message.startswith(head):
                return message
        return text


def compile_hooks() -> CompileHooks | None:
    """CompileHooks, or None where this torch cannot run compiled code under a dispatch mode
    (no `TorchDispatchMode.ignore_compile_internals`, no compile callbacks)."""
    if not hasattr(TorchDispatchMode, "ignore_compile_internals"):
        return None
    try:
        return CompileHooks()
    except (ImportError, AttributeError):
        return None


__all__ += ["CompileHooks", "compile_hooks"]
