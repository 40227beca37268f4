"""torch.compile under the tracer: compiled code stays compiled.

With a torch whose dispatch modes can say `ignore_compile_internals` (modes.DispatchMode
does), Dynamo compiles with the tracer's modes off and runs the compiled artifact under them,
so the tracer sees only what the artifact still dispatches: the code of a graph break, the ops
Inductor calls out to (matmuls, fallbacks) and host reads inside a graph (`u0 = buf0.item()`).
The function mode passes every call through while Dynamo traces (`is_dynamo_compiling()` is
True only then), so the graphs are those of a run without the tracer.

`CompileWatch`, entered for the tracer's lifetime where torch allows it:

- wraps each graph Dynamo hands to its backend (`OutputGraph.call_user_compiler`), so that a
  call of the compiled graph is a *region*: a boundary for call sites (what it dispatches has
  the line of the graph's first host read, else of its first node, from the FX nodes' stack
  traces, rather than the compiled function's `def` line), one op row "Torch-Compiled Region:
  F/C" (Kineto's name for it), and, on the simulated GPU, its outputs on the device of its
  inputs and its device time modeled as one memory-bound kernel (what Inductor fuses);
- lifts the simulated GPU's patches of torch.cuda while Dynamo and the backend compile (the
  compile sees the host it runs on: graphs are compiled for the CPU);
- collects the graph breaks Dynamo takes (its reason, GB code and user frame), the graphs and
  the recompiles, for `trace.compile` (core/compiled.py).
"""

from __future__ import annotations

import os
import re
import sys
import types
from time import perf_counter_ns
from typing import Any, Callable

import torch

from ..core.compiled import CompileInfo, GraphBreak, GraphRecord
from ..core.paths import is_internal_file, is_package_file
from ..core.torch_private import CompileHooks, compile_hooks
from ..core.trace import Site
from .optable import OP_INFO, OpInfo, op_info
from .sites import UNSET
from .state import tensor_args, tensors_out, with_kwarg_tensors

_getframe = sys._getframe
_DisableTorchFunction = torch._C.DisableTorchFunction
Tensor = torch.Tensor
#: FX targets that read device data back to the host (Dynamo's graph, before AOT autograd).
_HOST_READS = {"item", "tolist", "nonzero", "__bool__", "__int__", "__float__",
               "_local_scalar_dense", "masked_select", "unique", "bincount", "argwhere"}
_STACK_LINE = re.compile(r'File "([^"]+)", line (\d+), in (\S+)')
_GB_CODE = re.compile(r"/gb/(gb\d+)\.html|\b(GB\d{4})\b")
#: Dynamo's own entry after a break it cannot resume from inside a nested call
_STEP_UNSUPPORTED = "step_unsupported"
#: Reasons Dynamo records in its internal words, as its graph-break site names them
_INTERNAL_REASONS = (("generic_jump", "Data-dependent branching", "GB0170"),)


def _title(text: str) -> tuple[str, str | None]:
    """A graph break's reason in one line, and its GB code where the text names one."""
    stripped = text.strip()
    title = stripped.splitlines()[0] if stripped else "graph break"
    for prefix, name, code in _INTERNAL_REASONS:
        if title.startswith(prefix):
            return f"{name} ({title})", code
    return title, gb_code(text)


def compile_supported() -> bool:
    """Whether this torch runs compiled code under a dispatch mode that ignores compile
    internals; an older one runs a compiled function eagerly under the tracer."""
    return compile_hooks() is not None


def _site(file: str, line: int, function: str) -> Site:
    return Site(file if file.startswith("<") else os.path.abspath(file), line, function)


def stack_site(stack_trace: str | None) -> Site | None:
    """The innermost frame outside torch and this package of an FX node's `stack_trace`
    (Python's traceback text, outermost first)."""
    if not stack_trace:
        return None
    found = None
    for file, line, function in _STACK_LINE.findall(stack_trace):
        if not is_internal_file(file):
            found = (file, int(line), function)
    return _site(*found) if found else None


def _target_name(node: Any) -> str:
    target = node.target
    if isinstance(target, str):
        return target
    name = getattr(target, "__name__", "") or str(target)
    return name.split(".")[0] if name.startswith("_local") else name


def graph_sites(gm: Any) -> tuple[Site | None, list[Site]]:
    """A Dynamo graph's first user line and the lines of its host reads, in order."""
    first, reads = None, []
    for node in gm.graph.nodes:
        if node.op not in ("call_function", "call_method", "call_module"):
            continue
        site = stack_site(node.meta.get("stack_trace"))
        if site is None:
            continue
        first = first or site
        if _target_name(node) in _HOST_READS:
            reads.append(site)
    return first, reads


def gb_code(text: str) -> str | None:
    """The GB code of a Dynamo graph-break message ("GB0124"), if it names one."""
    found = _GB_CODE.search(text)
    if not found:
        return None
    return (found.group(1) or found.group(2)).upper()


def break_site(user_stack: Any) -> Site | None:
    """The innermost frame outside torch and this package of a graph break's user stack
    (FrameSummary objects, outermost first); None for a break inside the tracer's own
    function mode, which Dynamo traces through (the same break is also reported at the
    program's line)."""
    stack = list(user_stack or ())
    if stack and all(is_package_file(frame.filename) for frame in stack):
        return None
    for frame in reversed(stack):
        if not is_internal_file(frame.filename):
            return _site(frame.filename, frame.lineno, frame.name)
    return None


def _device_of(ins: list, dev_in: list) -> str:
    """The device a region ran on: that of its first input on the device."""
    t = ins[dev_in.index(True)]
    return f"cuda:{t.get_device()}" if t.is_cuda else "cuda:0"  # (the simulated GPU's: 0)


def _in_region(plain: Callable, entry: list | None, reads: list | None,
               mark_storages: Callable | None, state_here: Callable) -> Callable:
    """The dispatch mode's handler inside a region: on the simulated GPU (`mark_storages`),
    the tensors an op reads are marked as device memory first (if they are not yet); with
    several host reads (`reads`), each op that reads the device from the host moves the
    region's site (`entry[1]`) on to the next read's line, in the graph's order."""
    taken = [0]

    def region_dispatch(mode: Any, func: Any, types: Any, args: tuple = (),
                        kwargs: dict | None = None) -> Any:
        if state_here().suspended:
            return plain(func, types, args, kwargs)
        if mark_storages is not None:
            with _DisableTorchFunction():
                ins = tensor_args(args)
                mark_storages(with_kwarg_tensors(ins, kwargs) if kwargs else ins)
        try:
            return plain(func, types, args, kwargs)
        finally:
            if reads is not None and (OP_INFO.get(id(func)) or op_info(func)).sync:
                taken[0] += 1
                entry[1] = reads[min(taken[0], len(reads) - 1)]

    return region_dispatch


def _swap_dispatch(state: Any, entry: list | None, reads: list | None,
                   mark_storages: Callable | None, state_here: Callable) -> Callable:
    """Put `_in_region`'s handler in place of the thread's dispatch handler; returns what
    puts the thread's own back."""
    mode = state.dispatch_mode
    plain = mode.__torch_dispatch__
    mode.__torch_dispatch__ = types.MethodType(
        _in_region(plain, entry, reads, mark_storages, state_here), mode)
    return lambda: setattr(mode, "__torch_dispatch__", plain)


#: The code of every region's dispatch handler (one code object for all the closures)
_REGION_DISPATCH_CODE = _in_region(None, [], None, None, None).__code__


class _Region:
    """One compiled graph: what its calls record."""

    __slots__ = ("record", "info", "site", "calls", "breaks_at")

    def __init__(self, record: GraphRecord) -> None:
        self.record = record  # (its host reads: record.host_reads)
        #: where what it dispatches is: its first host read, else its first user line
        self.site = record.host_reads[0] if record.host_reads else record.site
        self.info = OpInfo(name=record.name, short="compiled_region", kernel=True, sync=None,
                           index=False, reads=False, mixed_ok=True, flops=None,
                           pass_through=False, lone_tensor=False, call=None)
        self.calls = 0
        self.breaks_at: GraphBreak | None = None  # the break this graph ends at


class CompileWatch:
    """Regions, graph breaks, graphs and recompiles of the compiles made while tracing.

    `hooks`: torch.compile's private parts (core/torch_private.compile_hooks());
    `state_here()`: the calling thread's TraceState; `recorder(state)`: its per-op record
    step (tracer/perop.py); `lift()`/`restore()`: take the simulated GPU's patches of
    torch.cuda away while a compile runs, and put them back (None on a real GPU)."""

    def __init__(self, hooks: CompileHooks, state_here: Callable[[], Any],
                 recorder: Callable[[Any], Any], sim: Any, lift: Callable[[], None] | None,
                 restore: Callable[[], None] | None) -> None:
        self.hooks = hooks
        self.state_here, self.recorder, self.sim = state_here, recorder, sim
        self.lift, self.restore = lift, restore
        self.regions: list[_Region] = []
        self.breaks: dict[tuple, GraphBreak] = {}
        self.recompiles = 0
        self._records: dict[int, Any] = {}
        self._reasons_seen = 0
        self._last_break: GraphBreak | None = None
        self._saved: Any = None
        self._compiling = 0
        self.skips: list[str] = []  # why Inductor did not use CUDA graphs, as it said
        self._skip_loggers: list[tuple[Any, Any]] = []

    # ----- entering and leaving -----
    def __enter__(self) -> CompileWatch:
        hooks = self.hooks
        self._reasons_seen = len(hooks.graph_break_reasons)
        self._skips_counted = hooks.cudagraph_skips()
        self._saved = hooks.output_graph.__dict__["call_user_compiler"]
        hooks.output_graph.call_user_compiler = self._compiler_wrapper(self._saved)
        hooks.on_start(self._compile_started)
        hooks.on_end(self._compile_ended)
        if self.sim is not None:
            runtime = hooks.aot_runtime
            self._saved_call = runtime.call_func_at_runtime_with_args
            runtime.call_func_at_runtime_with_args = self._marking(self._saved_call)
        return self

    def __exit__(self, *exc: Any) -> None:
        hooks = self.hooks
        hooks.output_graph.call_user_compiler = self._saved
        hooks.remove_start(self._compile_started)
        hooks.remove_end(self._compile_ended)
        if self.sim is not None:
            hooks.aot_runtime.call_func_at_runtime_with_args = self._saved_call
        for module, original in self._skip_loggers:
            module.log_cudagraph_skip_and_bump_counter = original
        self._skip_loggers.clear()
        self._collect_breaks()

    def _hear_cudagraph_skips(self) -> None:
        """Hear each reason Inductor gives for not using CUDA graphs, once its modules are
        there (the first graph handed to a backend imports them)."""
        if self._skip_loggers:
            return
        skips = self.skips

        for module in self.hooks.cudagraph_skip_loggers():
            original = module.log_cudagraph_skip_and_bump_counter

            def log_cudagraph_skip_and_bump_counter(msg: str, _original: Any = original) -> Any:
                if msg not in skips:
                    skips.append(msg)
                return _original(msg)

            module.log_cudagraph_skip_and_bump_counter = log_cudagraph_skip_and_bump_counter
            self._skip_loggers.append((module, original))

    def _marking(self, call: Callable) -> Callable:
        """AOT autograd's call of a compiled backward (and of a forward that records one), on
        the simulated GPU: what it dispatches touches buffers Inductor made on the host, and
        its new outputs live where its inputs do (the autograd engine hands a compiled
        backward's gradients on without an op the tracer sees)."""
        marks, state_here = self.sim.cuda_marks, self.state_here

        def call_func_at_runtime_with_args(f: Any, args: Any, *rest: Any, **kwargs: Any) -> Any:
            state = state_here()
            if state is None or state.suspended or not marks.refs:
                return call(f, args, *rest, **kwargs)
            with _DisableTorchFunction():
                on_device = True in marks.inputs([a for a in args if isinstance(a, Tensor)])
            if not on_device:
                return call(f, args, *rest, **kwargs)
            put_back = _swap_dispatch(state, None, None, marks.mark_outputs, state_here)
            try:
                out = call(f, args, *rest, **kwargs)
            finally:
                put_back()
            with _DisableTorchFunction():
                marks.mark_outputs(tensors_out(out))
            return out

        return call_func_at_runtime_with_args

    def _compile_started(self, *args: Any) -> None:
        self._compiling += 1
        compile_id = self.hooks.compile_id()
        if compile_id is not None and getattr(compile_id, "frame_compile_id", 0):
            self.recompiles += 1
        if self._compiling == 1 and self.lift is not None:
            self.lift()

    def _compile_ended(self, *args: Any) -> None:
        self._compiling -= 1
        self._collect_breaks()
        if self._compiling == 0 and self.restore is not None:
            self.restore()

    # ----- graphs and their regions -----
    def _compiler_wrapper(self, call_user_compiler: Callable) -> Callable:
        watch = self

        def wrapped(graph: Any, gm: Any, example_inputs: Any) -> Any:
            watch._hear_cudagraph_skips()
            compiled = call_user_compiler(graph, gm, example_inputs)
            return watch.region(gm, compiled)

        return wrapped

    def region(self, gm: Any, compiled: Callable) -> Callable:
        """`compiled`, run as a region of the trace."""
        compile_id = self.hooks.compile_id()
        label = str(compile_id) if compile_id is not None else str(len(self.regions))
        first, reads = graph_sites(gm)
        record = GraphRecord(name=f"Torch-Compiled Region: {label}", site=first,
                             nodes=sum(1 for n in gm.graph.nodes
                                       if n.op not in ("placeholder", "output")),
                             host_reads=list(reads))
        region = _Region(record)
        self.regions.append(region)
        self._collect_breaks(region)
        return self._runner(region, compiled)

    def _runner(self, region: _Region, compiled: Callable) -> Callable:
        state_here, records, sim = self.state_here, self._records, self.sim
        marks = sim.cuda_marks if sim is not None else None
        record_for = self.recorder

        def run_compiled_region(*args: Any, **kwargs: Any) -> Any:
            state = state_here()
            if state is None or state.suspended:
                return compiled(*args, **kwargs)
            region.calls += 1
            with _DisableTorchFunction():  # the tracer's own reads: not the program's
                ins = [a for a in args if isinstance(a, Tensor)]
                if marks is None:
                    dev_in = [t.is_cuda for t in ins]
                else:
                    dev_in = marks.inputs(ins) if marks.refs else [False] * len(ins)
            any_dev = True in dev_in
            calls = state.sites.calls
            entry = [_getframe(0), UNSET if region.site is None else region.site]
            calls.append(entry)
            reads = region.record.host_reads
            mark = any_dev and marks is not None  # what the region still dispatches may
            walk = len(reads) > 1  # touch buffers Inductor made on the host (on a GPU,
            # device memory); a region with several host reads has each at its own line
            put_back = _swap_dispatch(state, entry, reads if walk else None,
                                      marks.mark_outputs if mark else None,
                                      state_here) if mark or walk else None
            t0 = perf_counter_ns()
            try:
                out = compiled(*args, **kwargs)
            finally:
                calls.pop()
                if put_back is not None:
                    put_back()
            host_ns = perf_counter_ns() - t0
            with _DisableTorchFunction():
                outs = tensors_out(out)
                if any_dev and marks is not None:  # the artifact ran on the host: its
                    marks.mark_outputs(outs)  # new outputs live where its inputs do
                record = records.get(id(state))
                if record is None:
                    record = records[id(state)] = record_for(state)
                device = _device_of(ins, dev_in) if any_dev else "cpu"
                site = region.site
                if site is None:  # a graph of torch's own code (a compiled nn.Sequential):
                    site = entry[1] if entry[1] is not UNSET else (  # the caller's line
                        state.sites.resolve_from(_getframe(0).f_back))
                    if region.record.site is None:
                        region.record.site = site
                record(region.info, args, kwargs, ins, out, outs, dev_in, any_dev, device,
                       site, host_ns)
            return out

        self.hooks.skip_frame(run_compiled_region.__code__)  # never compiled when called
        self.hooks.skip_frame(_REGION_DISPATCH_CODE)
        self._boundary(run_compiled_region.__code__)
        return run_compiled_region

    def _boundary(self, code: Any) -> None:
        state = self.state_here()
        if state is not None:
            state.sites.add_boundary(code)

    # ----- graph breaks -----
    def _collect_breaks(self, region: _Region | None = None) -> None:
        """The graph breaks Dynamo took since the last look, one per user line; the first
        new one is where `region` (the graph compiled now) ends."""
        reasons = self.hooks.graph_break_reasons
        for reason in reasons[self._reasons_seen:]:
            text = str(getattr(reason, "reason", ""))
            if text.strip() == _STEP_UNSUPPORTED:  # Dynamo's "compile up to the last
                brk = self._last_break  # resumable point" after a break it cannot resume
                # from: the same break, not another
            else:
                site = break_site(getattr(reason, "user_stack", None))
                if site is None:
                    continue
                title, code = _title(text)
                key = (site.file, site.line)
                brk = self.breaks.get(key)
                if brk is None:
                    brk = self.breaks[key] = GraphBreak(
                        site=site, reason=title, detail=text,
                        gb_code=code or gb_code(self.hooks.full_message(text)))
                self._last_break = brk
            if brk is not None and region is not None and region.breaks_at is None:
                region.breaks_at = brk
        self._reasons_seen = len(reasons)

    def info(self) -> CompileInfo:
        """What the compiles made while tracing amount to (calls as counted so far)."""
        for brk in self.breaks.values():
            brk.graph_calls = sum(r.calls for r in self.regions if r.breaks_at is brk)
        graphs = []
        for region in self.regions:
            region.record.calls = region.calls
            graphs.append(region.record)
        skips, notes = list(self.skips), []
        counted = self.hooks.cudagraph_skips() > self._skips_counted
        if self.sim is not None and (skips or counted):  # Inductor compiled for the host: CUDA
            skips = []  # graphs were never an option, whatever the program asked
            notes.append('mode="reduce-overhead": CUDA graphs are not simulated (the '
                         "simulated GPU's compiled code is CPU code)")
        return CompileInfo(supported=True, graphs=graphs, recompiles=self.recompiles,
                           graph_breaks=list(self.breaks.values()), cudagraph_skips=skips,
                           notes=notes)
