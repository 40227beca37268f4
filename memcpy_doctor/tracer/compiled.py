"""torch.compile under the tracer: compiled code stays compiled.

With a torch whose dispatch modes can say `ignore_compile_internals` (modes.DispatchMode
does), Dynamo compiles with the tracer's modes off and runs the compiled artifact under them,
so the tracer sees only what the artifact still dispatches: the code of a graph break, the ops
Inductor calls out to (matmuls, fallbacks) and host reads inside a graph (`u0 = buf0.item()`).
The function mode passes every call through while Dynamo traces (`is_dynamo_compiling()` is
True only then), so the graphs are those of a run without the tracer.

`CompileWatch`, entered for the tracer's lifetime where torch allows it:

- wraps each graph Dynamo hands to its backend (`OutputGraph.call_user_compiler`), so that a
  call of the compiled graph is a *region* (tracer/regions.py: a boundary for call sites, one
  op row, its first calls traced op by op and, where they made no copy, the later ones not),
  found at its user lines from the FX nodes' stack traces;
- wraps AOT autograd's call of a compiled graph (`call_func_at_runtime_with_args`), so that a
  compiled backward the autograd engine runs is a region of its own (regions.BackwardRunner),
  and, on the simulated GPU, what a compiled forward makes is marked as the device's;
- lifts the simulated GPU's patches of torch.cuda while Dynamo and the backend compile (the
  compile sees the host it runs on: graphs are compiled for the CPU);
- collects the graph breaks Dynamo takes (its reason, GB code and user frame), the graphs and
  the recompiles, for `trace.compile` (core/compiled.py).
"""

from __future__ import annotations

import os
import re
from typing import Any, Callable

import torch

from ..core.compiled import BACKWARD_GRAPH, CompileInfo, GraphBreak, GraphRecord
from ..core.defaults import REGION_CALLS_TRACED
from ..core.paths import is_internal_file, is_package_file
from ..core.torch_private import CompileHooks, compile_hooks
from ..core.trace import Site
from .regions import BackwardRunner, Region, RegionRunner, RegionScope, enter_region
from .tensors import tensors_out

_DisableTorchFunction = torch._C.DisableTorchFunction
Tensor = torch.Tensor
#: FX targets that read device data back to the host (Dynamo's graph, before AOT autograd).
_HOST_READS = {"item", "tolist", "nonzero", "__bool__", "__int__", "__float__",
               "_local_scalar_dense", "masked_select", "unique", "bincount", "argwhere"}
#: FX targets that move a tensor to a device (`to` only with a device named by a string, as
#: `.to("cpu")`, or `.to("cuda")` made the host's for a compile on the simulated GPU)
_MOVES = {"cpu", "cuda", "to"}
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


def graph_sites(gm: Any) -> tuple[Site | None, list[Site], list[Site]]:
    """A Dynamo graph's first user line, the lines of its host reads, in order, and those of
    the calls in it that move a tensor to a device (`.cpu()`, `.cuda()`, `.to("cuda")`)."""
    first, reads, moves = None, [], []
    for node in gm.graph.nodes:
        if node.op not in ("call_function", "call_method", "call_module"):
            continue
        site = stack_site(node.meta.get("stack_trace"))
        if site is None:
            continue
        first = first or site
        name = _target_name(node)
        if name in _HOST_READS:
            reads.append(site)
        elif name in _MOVES and (name != "to" or any(
                isinstance(a, str) for a in (*node.args, *node.kwargs.values()))):
            moves.append(site)  # (`.to(x.device)`, most often to the same device: not one)
    return first, reads, moves


def symbolic(example_inputs: Any) -> bool:
    """Whether a graph was compiled for symbolic shapes: a SymInt among its inputs or their
    sizes (a static graph's guards fix its inputs' shapes)."""
    for x in example_inputs or ():
        if isinstance(x, torch.SymInt):
            return True
        if isinstance(x, torch.Tensor) and not all(isinstance(d, int) for d in x.shape):
            return True
    return False


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


class CompileWatch:
    """Regions, graph breaks, graphs and recompiles of the compiles made while tracing.

    `hooks`: torch.compile's private parts (core/torch_private.compile_hooks());
    `state_here()`: the calling thread's ThreadContext; `recorder(state)`: its per-op record
    step (tracer/perop.py); `lift()`/`restore()`: take the simulated GPU's patches of
    torch.cuda away while a compile runs, and put them back (None on a real GPU);
    `calls_traced`: a region's calls traced op by op per input shapes before it may run
    steady (tracer/regions.py; None: every call)."""

    def __init__(self, hooks: CompileHooks, state_here: Callable[[], Any],
                 recorder: Callable[[Any], Any], sim: Any, lift: Callable[[], None] | None,
                 restore: Callable[[], None] | None,
                 calls_traced: int | None = REGION_CALLS_TRACED) -> None:
        self.hooks = hooks
        self.calls_traced = calls_traced
        self.state_here, self.recorder, self.sim = state_here, recorder, sim
        self.lift, self.restore = lift, restore
        self.regions: list[Region] = []
        self.breaks: dict[tuple, GraphBreak] = {}
        self.recompiles = 0
        self._reasons_seen = 0
        self._last_break: GraphBreak | None = None
        self._saved: Any = None
        self._compiling = 0
        self.skips: list[str] = []  # why Inductor did not use CUDA graphs, as it said
        self.notes: list[str] = []  # what the simulated GPU could not model of a graph
        self._skip_loggers: list[tuple[Any, Any]] = []
        #: id(compiled backward) -> (it, its runner): AOT autograd's backward graphs
        self._backwards: dict[int, tuple[Any, BackwardRunner]] = {}

    # ----- entering and leaving -----
    def __enter__(self) -> CompileWatch:
        hooks = self.hooks
        self._reasons_seen = len(hooks.graph_break_reasons)
        self._skips_counted = hooks.cudagraph_skips()
        self._saved = hooks.output_graph.__dict__["call_user_compiler"]
        hooks.output_graph.call_user_compiler = self._compiler_wrapper(self._saved)
        hooks.on_start(self._compile_started)
        hooks.on_end(self._compile_ended)
        runtime = hooks.aot_runtime
        self._saved_call = runtime.call_func_at_runtime_with_args
        runtime.call_func_at_runtime_with_args = self._runtime_call(self._saved_call)
        return self

    def __exit__(self, *exc: Any) -> None:
        hooks = self.hooks
        hooks.output_graph.call_user_compiler = self._saved
        hooks.remove_start(self._compile_started)
        hooks.remove_end(self._compile_ended)
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

    def _runtime_call(self, call: Callable) -> Callable:
        """AOT autograd's call of a compiled graph. A backward's, made by the autograd engine
        for a CompiledFunctionBackward node, runs as a region of its own (BackwardRunner,
        one per compiled backward); a forward's, inside its region, on the simulated GPU
        marks what it makes (_marking)."""
        forward = self._marking(call) if self.sim is not None else call
        runners: dict[int, tuple[Any, BackwardRunner]] = self._backwards
        state_here, current_node = self.state_here, torch._C._current_autograd_node

        def call_func_at_runtime_with_args(f: Any, args: Any, *rest: Any, **kwargs: Any) -> Any:
            state = state_here()
            if state is None or state.suspended:
                return call(f, args, *rest, **kwargs)
            node = current_node()
            if node is None or node.name() != BACKWARD_GRAPH:
                return forward(f, args, *rest, **kwargs)
            found = runners.get(id(f))
            if found is None or found[0] is not f:
                found = runners[id(f)] = (f, self._backward_runner())
            return found[1](state, call, f, args, rest, kwargs)

        self.hooks.skip_frame(call_func_at_runtime_with_args.__code__)
        return call_func_at_runtime_with_args

    def _backward_runner(self) -> BackwardRunner:
        region = Region(GraphRecord(name=BACKWARD_GRAPH, site=None, nodes=0), dynamic=True)
        self.regions.append(region)
        for code in (BackwardRunner.__call__.__code__, BackwardRunner._finish.__code__):
            self.hooks.skip_frame(code)  # never compiled when called
        return BackwardRunner(region, self.state_here, self.recorder, self.sim,
                              self.calls_traced)

    def _marking(self, call: Callable) -> Callable:
        """AOT autograd's call of a compiled forward that records a backward, on the
        simulated GPU: what it dispatches touches buffers Inductor made on the host, and
        its new outputs live where its inputs do."""
        marks, state_here = self.sim.cuda_marks, self.state_here

        def call_func_at_runtime_with_args(f: Any, args: Any, *rest: Any, **kwargs: Any) -> Any:
            state = state_here()
            if state is None or state.suspended or not marks.refs:
                return call(f, args, *rest, **kwargs)
            with _DisableTorchFunction():
                on_device = True in marks.inputs([a for a in args if isinstance(a, Tensor)])
            if not on_device:
                return call(f, args, *rest, **kwargs)
            put_back = enter_region(state, None, None, marks.mark_outputs)
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
            return watch.region(gm, compiled, example_inputs)

        return wrapped

    def region(self, gm: Any, compiled: Callable, example_inputs: Any = ()) -> Callable:
        """`compiled`, run as a region of the trace (tracer/regions.py); `example_inputs`:
        Dynamo's fake inputs, whose symbolic sizes say the graph takes any shape."""
        compile_id = self.hooks.compile_id()
        label = str(compile_id) if compile_id is not None else str(len(self.regions))
        first, reads, moves = graph_sites(gm)
        record = GraphRecord(name=f"Torch-Compiled Region: {label}", site=first,
                             nodes=sum(1 for n in gm.graph.nodes
                                       if n.op not in ("placeholder", "output")),
                             host_reads=list(reads))
        region = Region(record, dynamic=symbolic(example_inputs))
        if moves and self.sim is not None:
            self.notes.append(
                f"{record.name} moves tensors between devices inside the graph (at "
                f"{', '.join(sorted({f'{os.path.basename(s.file)}:{s.line}' for s in moves}))}): "
                "the simulated GPU compiles it for the host, so these copies are not recorded "
                "and all its outputs are on the device of its inputs")
        self.regions.append(region)
        self._collect_breaks(region)
        return self._runner(region, compiled)

    def _runner(self, region: Region, compiled: Callable) -> Callable:
        runner = RegionRunner(region, self.hooks.innermost(compiled), self.state_here,
                              self.recorder, self.sim, self.calls_traced)
        for code in (RegionRunner.__call__.__code__, RegionRunner._traced.__code__,
                     RegionRunner._finish.__code__, RegionScope.enter.__code__,
                     RegionScope.leave.__code__):
            self.hooks.skip_frame(code)  # never compiled when called
        self._boundary(RegionRunner._traced.__code__)
        return runner

    def _boundary(self, code: Any) -> None:
        state = self.state_here()
        if state is not None:
            state.sites.add_boundary(code)

    # ----- graph breaks -----
    def _collect_breaks(self, region: Region | None = None) -> None:
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
            region.record.traced_calls = region.traced_calls
            graphs.append(region.record)
        skips, notes = list(self.skips), list(self.notes)
        counted = self.hooks.cudagraph_skips() > self._skips_counted
        if self.sim is not None and (skips or counted):  # Inductor compiled for the host: CUDA
            skips = []  # graphs were never an option, whatever the program asked
            notes.append('mode="reduce-overhead": CUDA graphs are not simulated (the '
                         "simulated GPU's compiled code is CPU code)")
        return CompileInfo(supported=True, graphs=graphs, recompiles=self.recompiles,
                           graph_breaks=list(self.breaks.values()), cudagraph_skips=skips,
                           notes=notes)
