"""The other way traces come in, beside the tracer: torch.profiler (Kineto) traces, and the
ExecutionTraceObserver files of the same runs, read from their JSON into memcpy-doctor traces
measured on the GPU that recorded them (docs/kineto.md).

`sniff.py` tells a torch.profiler trace by its first bytes; `stream.py` reads a trace's file
as a stream, its events kept as they are parsed as rows of `events.py`'s temporary SQLite
store (memory stays flat), where the joins run; `reader.py` maps copies, waits and the Event
Summary; `stacks.py` finds the ops and Python frames around each runtime call and what is
around each copy (its wait, the kernels before and after it on its stream); `frames.py` says
which Python frames are sites; `et.py` joins an execution trace (kept in a store too) for
exact producers and consumers; `timing.py` reads the timings `calibrate --from-trace` fits.
Like the tracer, this stage stands on core/ only, and it never imports torch: reading a trace
needs no GPU and no PyTorch."""
