"""Every default and constant the rest of the package shares, in one place."""

#: Version of the saved trace format; bump on any incompatible change.
SCHEMA_VERSION = 3

#: Where `memcpy-doctor profile` writes the trace when -o is not given (relative to the cwd).
DEFAULT_TRACE_PATH = "memcpy_doctor_trace.json"

#: Device the profiler runs on when none is named: real CUDA if present, else simulated.
DEFAULT_DEVICE = "auto"
DEVICE_CHOICES = ("auto", "cuda", "sim")

#: Event Summary sort keys (Paddle's) and the default one.
SORT_KEYS = ("calls", "total", "max", "min", "ave")
DEFAULT_SORT_KEY = "total"

#: Device profile the simulated GPU uses when none is named.
DEFAULT_DEVICE_PROFILE = "a100-sxm4-80gb"

#: The simulated GPU's host side (docs/sim-time.md), for profiles that do not give their own:
#: the program's own Python time per op (between one op and the next), the host's cost of
#: an op that launches no kernel (a view, an allocation, an op on host tensors: PyTorch's
#: dispatcher, with small tensors), and the host's compute roofline for ops on host tensors.
#: Typical figures, not measured per run, so that the same program gives the same times
#: on any machine. For comparison, on the 2-core build machine (torch 2.13, one thread,
#: `python -m timeit`): torch.empty(64) 1.1 us, a.view(8, 8) 1.3 us, a[1:] 1.6 us,
#: torch.add(a, b) 1.8 us, a * 0.5 3.9 us; a 1024x1024 float32 mm 86 GFLOP/s.
PYTHON_OP_NS = 1_000
HOST_OP_NS = 2_000
HOST_FLOPS = 1e11
HOST_MEMORY_BANDWIDTH = 1e10

#: What device_guard itself costs the host on a real GPU (docs/sim-time.md, measured on the
#: build machine with timeit): one guard block's entry and exit, and each torch call the
#: guard's mode handles inside it (8.3 us for narrow_copy, 10.9 us for an add, 2.3 us for a
#: view). explain counts them against a device_guard edit's saving; the simulated GPU's
#: modeled time never includes them.
GUARD_BLOCK_NS = 12_000
GUARD_CALL_NS = 10_000

#: Transfers kept, in order, in the trace's transfer log (`profile --log-transfers N`, read by
#: `explain --log`). Off by default: the log is the one part of a trace that grows with the
#: run, so it is asked for, and capped at N (the rest are counted).
DEFAULT_TRANSFER_LOG = 0

#: Events kept on the timeline `profile --chrome-trace` writes (the rest are counted).
CHROME_EVENTS = 200_000

#: Events (ops, copies, host waits) kept, in the order they happened, in the trace's
#: `timeline` (`profile --timeline-events N`): the run's first steps, for what needs the
#: order rather than the aggregates (explain's replay, the race checker). A bound, so that
#: the trace does not grow with the run; past it the per-op path pays one comparison.
TIMELINE_EVENTS = 10_000

#: explain's replay plays at most this many of a timeline's first events (a trace profiled
#: with a larger --timeline-events): past them, a saving is scaled by the calls it changes,
#: as past the timeline's end, so that explain stays well under a second (issue 40;
#: benchmarks/explain_replay.py).
REPLAY_EVENTS = 100_000

#: The tracer's table of which op made each live tensor is swept of freed tensors' entries
#: once it holds twice as many entries as after the last sweep, and never below this size
#: (the Python version of the table; the compiled one sweeps whenever it fills, from 64).
PRODUCER_SWEEP_MIN = 4096
#: A host op's call times are kept as a list and folded into its totals (count, sum, min,
#: max, by the C built-ins) when the list reaches this length, and at the end: a list append
#: costs the per-op path a fraction of five counter updates. Bounds the lists' memory.
OP_TIMES_FOLD_AT = 64

#: A copy path repeats "per step" when its calls spread over at least this share of the run
#: (its first to its last call); one call, or calls in one burst (model.to's copies of each
#: parameter), are setup or one-off (analysis/steady.py).
PER_STEP_MIN_SPREAD = 0.25

#: A compiled graph's calls traced op by op (per input shapes, for a graph compiled for any
#: shape) before its calls may run with the tracer off inside: once that many made no copy
#: and no host wait inside the graph, its straight-line code makes none on those shapes
#: (tracer/regions.py; `profile --trace-compiled-calls`). The first call may also set up.
REGION_CALLS_TRACED = 3

#: Most user frames kept in a copy record's stack.
MAX_STACK_FRAMES = 16

#: How many sync copy sites the text report lists.
REPORT_SYNC_SITES = 20

#: How many sync copy paths (and suggestions) the HTML report shows per trace, heaviest
#: first; a line says how many it left out. Each row holds its chain and stack, so a trace
#: with thousands of paths (a library copying from many lines) stays one page a browser
#: opens at once.
HTML_SYNC_PATHS = 50

#: torch's print threshold and edge items (torch.set_printoptions defaults) decide how much
#: of a device tensor print() copies to the host.
PRINT_THRESHOLD = 1000
PRINT_EDGEITEMS = 3

#: The warning PyTorch's sync-debug mode raises at each sync it sees
#: (`torch.cuda.set_sync_debug_mode("warn")`, c10/cuda/CUDAFunctions.cpp
#: `warn_or_error_on_sync`; TORCH_WARN adds " (Triggered internally at ...)"), which the
#: simulated GPU raises too; `profile --light` counts the syncs by it.
SYNC_DEBUG_WARNING = "called a synchronizing CUDA operation"
#: The trigger of a sync that `profile --light` found by that warning (its direction and size
#: unknown).
LIGHT_SYNC_TRIGGER = "sync_debug"
#: A copy's direction where the tracer cannot know it (a light-mode sync whose call does not
#: say: `to`, `copy_`, a library's own C++ call); never a guess.
UNKNOWN_DIRECTION = "unknown"

#: Exit status for usage errors (click's own convention) and for an interrupted run.
EXIT_USAGE = 2
EXIT_GATE_FAILED = 1
EXIT_INTERRUPTED = 130

#: A process ended by signal N has status 128+N, as a shell reports it (SIGTERM: 143).
EXIT_SIGNAL_BASE = 128

#: Signals whose default action ends the process without cleanup: while a script runs under
#: `profile`, they first write the report and trace (SIGINT is Python's KeyboardInterrupt).
#: Names, since SIGHUP does not exist everywhere.
HANDLED_SIGNALS = ("SIGTERM", "SIGHUP")

#: Seconds before such a signal is delivered again when it came while the tracer's own code
#: ran (the handler waits for that code to return; see runner._signal_hook).
SIGNAL_RETRY_S = 0.001
SIGNAL_DEFER_MAX_S = 1.0  # then it is acted on wherever it lands

#: `profile --ranks N`: seconds the other ranks get to end on their own after one failed,
#: then again after SIGTERM before SIGKILL (a rank may be stuck in a collective).
RANKS_GRACE_S = 5.0

#: The device of a torch.profiler trace that names none (no deviceProperties).
UNRECORDED_DEVICE = "a GPU (not recorded)"

#: Traces read together are one run's ranks only if they began within this many seconds of
#: each other: ranks profile the same steps, kept in step by their collectives, so they
#: begin within seconds; another run is minutes or days away (run/traces.py one_run).
RUN_START_SPREAD_S = 600

#: `memcpy-doctor calibrate`: where the measured profile goes, the copy sizes (bytes) fitted
#: per path, and how many times each measurement is repeated (the median is kept).
DEFAULT_CALIBRATED_PROFILE = "memcpy_doctor_device.json"
CALIBRATE_COPY_SIZES = tuple(1 << k for k in range(10, 29, 2))  # 1 KiB .. 256 MiB
CALIBRATE_COPY_SIZES_QUICK = tuple(1 << k for k in (12, 16, 20, 24))  # 4 KiB .. 16 MiB
CALIBRATE_REPEATS = 10
CALIBRATE_REPEATS_QUICK = 3

#: The "Not traced" note of a trace read without Python stacks (a torch.profiler profile
#: recorded without with_stack, kineto/reader.py), which `explain` repeats: no line to name.
NO_STACK_NOTE = ("call sites: the profile has no Python stacks; a torch.profiler profile "
                 "recorded with with_stack=True would name the lines")

#: The note of a trace of `profile --light` (tracer/light.py) that `explain` repeats: what a
#: sync found by PyTorch's sync-debug warning does not say.
LIGHT_SYNC_NOTE = ("light mode: a sync found only by its warning (mask indexing, a library's "
                   "read, a backward pass) is not timed (PyTorch hands the warning to Python "
                   "after the call that synced has returned; a backward pass's when the pass "
                   "ends) and its size is not known (0 bytes); its kind is the call at its "
                   "frame, and its direction where that call says it, else `unknown`")

#: A trace with runtime calls but no device activity: what its copies are made of.
LAUNCHES_NOTE = ("no device activity in the trace (recorded without ProfilerActivity.CUDA, "
                 "or CUPTI's runtime calls alone): each copy is its cudaMemcpy* call, with "
                 "its host time and whether the host waited; its direction only where the op "
                 "tells it (item, tolist, nonzero: to the host; else unknown); no bytes, "
                 "device time, producer or GPU idle")
