"""torch.compile under the tracer (tracer/compiled.py, core/compiled.py, render/compiled.py).

Real compiled programs of several shapes run under the tracer on the simulated GPU with
Inductor (CPU kernels): a graph break at `.item()`, a read Inductor fuses away, a fullgraph
program whose read sizes a tensor (an in-graph `u0 = buf0.item()`), a mask index, and a
compiled nn.Module trained with an optimizer. Each is held to the syncs the compiled program
makes, at the user's line, and to nothing the compiled program does not make. The helpers that
read Dynamo's output (stack traces, GB codes) and the report section are held to exact text on
hand-built input.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import traceback

import pytest
import torch

from memcpy_doctor.core.compiled import BreakCopy, CompileInfo, GraphBreak, GraphRecord
from memcpy_doctor.core.trace import Site, Trace
from memcpy_doctor.render.compiled import compile_lines
from memcpy_doctor.render.text import plain_table, render_text
from memcpy_doctor.tracer import Tracer
from memcpy_doctor.tracer.compiled import (break_site, compile_supported, gb_code,
                                           stack_site)

pytestmark = pytest.mark.skipif(not compile_supported(),
                                reason="this torch cannot keep compiled code compiled")


#: The issue's program: `.item()` in a compiled step, run 5 times; the read is on line 5 (and
#: on line 6 where a line that sets capture_scalar_outputs comes first).
ITEM_LOOP = textwrap.dedent("""\
    import torch
    @torch.compile
    def step(x, w):
        y = x @ w
        s = y.sum().item()
        return y * s
    x = torch.randn(16, 16, device="cuda"); w = torch.randn(16, 16, device="cuda")
    for i in range(5):
        out = step(x, w)
    """)


#: A fullgraph program whose in-graph read sizes a tensor (`u0 = buf0.item()`, line 5),
#: called `calls` times.
IN_GRAPH_READ = textwrap.dedent("""\
    import torch
    torch._dynamo.config.capture_scalar_outputs = True
    @torch.compile(fullgraph=True)
    def step(x):
        n = (x > 0).sum().item()
        torch._check_is_size(n)
        return torch.zeros(n, device=x.device) + x.mean()
    x = torch.arange(-3.0, 7.0, device="cuda")
    for i in range({calls}):
        out = step(x)
    where = str(out.device)
    torch._dynamo.config.capture_scalar_outputs = False
    """)


def run_program(tmp_path, source: str, name: str = "prog.py",
                device: str = "sim", **tracer_options) -> tuple[Trace, str, dict]:
    """Run `source` as a script under a tracer (the simulated GPU unless `device` says
    otherwise); its trace, path and globals."""
    path = tmp_path / name
    path.write_text(textwrap.dedent(source))
    torch._dynamo.reset()
    scope = {"__name__": "__main__", "__file__": str(path)}
    tracer = Tracer(device=device, **tracer_options)
    with tracer:
        exec(compile(path.read_text(), str(path), "exec"), scope)
    torch._dynamo.reset()
    return tracer.trace, str(path), scope


def syncs(trace: Trace) -> list[tuple[str, str, int, int]]:
    """(direction, trigger, line, calls) of each sync copy."""
    return sorted((c.direction, c.trigger, c.site.line if c.site else -1, c.calls)
                  for c in trace.copies if c.sync)


def regions(trace: Trace) -> dict[str, int]:
    return {o.op: o.calls for o in trace.ops if o.op.startswith("Torch-Compiled Region")}


def test_graph_break_at_item_is_priced_at_its_line(tmp_path):
    trace, path, scope = run_program(tmp_path, ITEM_LOOP + 'where = str(out.device)\n')
    assert scope["where"] == "cuda:0"  # the compiled region's output lives where its inputs do
    assert syncs(trace) == [("DtoH", "item", 5, 5)]
    assert sorted(regions(trace).values()) == [5, 5]  # the graphs before and after the break
    info = trace.compile
    assert info.supported and len(info.graphs) == 2 and info.recompiles == 0
    [brk] = info.graph_breaks
    assert (brk.site.file, brk.site.line) == (path, 5)
    assert brk.reason == "Unsupported Tensor.item() call with capture_scalar_outputs=False"
    assert brk.gb_code == "GB0124"
    assert brk.calls == 5 and brk.graph_calls == 5
    assert [(c.direction, c.trigger, c.calls, c.bytes) for c in brk.sync_copies] == [
        ("DtoH", "item", 5, 20)]
    # no aten op of the graphs ran one by one: only the matmul Inductor calls out to
    assert {o.op for o in trace.ops} == {"aten::randn", "aten::mm", *regions(trace)}


def test_read_fused_by_inductor_makes_no_sync(tmp_path):
    fused = ITEM_LOOP.replace("import torch\n", "import torch\n"
                              "torch._dynamo.config.capture_scalar_outputs = True\n")
    trace, path, _ = run_program(tmp_path, fused + (
        "torch._dynamo.config.capture_scalar_outputs = False\n"))
    assert syncs(trace) == []
    assert trace.compile.graph_breaks == []
    [graph] = trace.compile.graphs
    assert [(s.file, s.line) for s in graph.host_reads] == [(path, 6)] and graph.calls == 5
    text = render_text(trace)
    assert "prog.py:6  in Torch-Compiled Region: 0/0 (5 calls): no sync: the compiled code " \
           "keeps the value on the device" in text


def test_in_graph_read_is_at_the_user_line_not_the_def_line(tmp_path):
    trace, path, scope = run_program(tmp_path, IN_GRAPH_READ.format(calls=4))
    assert tuple(scope["out"].shape) == (6,) and scope["where"] == "cuda:0"
    assert syncs(trace) == [("DtoH", "item", 5, 4)]
    assert trace.compile.graph_breaks == []
    assert "prog.py:5  in Torch-Compiled Region: 0/0 (4 calls): a sync copy, 4 calls" \
           in render_text(trace)


def test_mask_index_breaks_the_graph_and_syncs_at_its_line(tmp_path):
    trace, path, scope = run_program(tmp_path, """\
        import torch
        @torch.compile
        def step(x):
            y = x * 2
            return y[y > 0].sum()
        x = torch.arange(-5.0, 5.0, device="cuda")
        for i in range(3):
            out = step(x)
        """)
    assert scope["out"].item() == 20.0
    assert syncs(trace) == [("DtoH", "mask", 5, 3)]
    [brk] = trace.compile.graph_breaks
    assert brk.site.line == 5 and brk.gb_code == "GB0036" and brk.calls == 3


def test_compiled_module_trains_with_an_optimizer(tmp_path):
    trace, path, scope = run_program(tmp_path, """\
        import torch, torch.nn as nn
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1)).cuda()
        compiled = torch.compile(model)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        x = torch.randn(4, 8).cuda(); y = torch.randn(4, 1).cuda()
        losses = []
        for step in range(8):
            opt.zero_grad()
            loss = nn.functional.mse_loss(compiled(x), y)
            loss.backward()
            opt.step()
            losses.append(loss.item())
        where = {str(t.device) for p in model.parameters() for t in (p, p.grad)}
        """)
    torch.manual_seed(0)  # the same steps eagerly on the host give the same losses
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(4, 8), torch.randn(4, 1)
    expected = []
    for _ in range(8):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        expected.append(loss.item())
    assert scope["losses"] == pytest.approx(expected, rel=1e-5)
    assert scope["where"] == {"cuda:0"}
    assert ("DtoH", "item", 13, 8) in syncs(trace)  # (and no copy the marks would miss)
    assert regions(trace) == {"Torch-Compiled Region: 0/0": 8}
    forward, backward = trace.compile.graphs  # the last 5 calls of each ran steady
    assert (forward.traced_calls, forward.calls) == (3, 8)
    assert (backward.name, backward.traced_calls, backward.calls) == (
        "CompiledFunctionBackward", 3, 8)
    assert _op_calls(trace, "CompiledFunctionBackward") == 8
    assert _op_calls(trace, "aten::mm") == 2 * 3  # the backward's matmuls: traced calls only


def test_a_failing_compile_fails_as_without_the_tool(tmp_path):
    script = tmp_path / "bad.py"
    script.write_text(textwrap.dedent("""\
        import torch
        @torch.compile(fullgraph=True)
        def f(x):
            print("side effect")
            return x + 1
        f(torch.randn(3))
        """))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([os.path.dirname(os.path.dirname(
        os.path.abspath(__file__))), os.environ.get("PYTHONPATH", "")])}
    plain, traced = (subprocess.run(cmd, capture_output=True, text=True, cwd=tmp_path, env=env)
                     for cmd in ([sys.executable, "bad.py"],
                                 [sys.executable, "-m", "memcpy_doctor", "profile", "bad.py"]))
    assert plain.returncode == traced.returncode == 1
    last = [line for line in plain.stderr.splitlines() if line.startswith("torch._dynamo")]
    assert last and last[0] in traced.stderr  # Dynamo's own error, unchanged
    frames = traced.stderr.split("Traceback (most recent call last):")[1].split(last[0])[0]
    assert 'bad.py", line 6' in frames and "memcpy_doctor" not in frames


def test_patches_are_undone_after_a_compiled_run(tmp_path):
    from memcpy_doctor.core.torch_private import compile_hooks
    hooks = compile_hooks()
    before = (hooks.output_graph.call_user_compiler,
              hooks.aot_runtime.call_func_at_runtime_with_args,
              list(torch._dynamo.callback_handler.start_callbacks),
              list(torch._dynamo.callback_handler.end_callbacks), torch.cuda.is_available)
    run_program(tmp_path, """\
        import torch
        f = torch.compile(lambda x: x.sin() + 1)
        f(torch.randn(4, device="cuda"))
        """)
    assert (hooks.output_graph.call_user_compiler,
            hooks.aot_runtime.call_func_at_runtime_with_args,
            list(torch._dynamo.callback_handler.start_callbacks),
            list(torch._dynamo.callback_handler.end_callbacks),
            torch.cuda.is_available) == before


def test_trace_compile_round_trips_through_json(tmp_path):
    trace, _, _ = run_program(tmp_path, """\
        import torch
        @torch.compile
        def step(x):
            return x.sum().item()
        x = torch.ones(4, device="cuda")
        for i in range(2):
            step(x)
        """)
    saved = tmp_path / "t.json"
    trace.save(saved)
    again = Trace.load(saved)
    assert again.compile == trace.compile
    assert again.to_dict()["compile"]["graph_breaks"][0]["gb_code"] == "GB0124"


# ----- Dynamo's output, read -----

def test_stack_site_takes_the_innermost_frame_outside_torch():
    import torch as t
    torch_file = os.path.join(os.path.dirname(t.__file__), "nn", "modules", "linear.py")
    text = (f'  File "/work/proj/model.py", line 12, in forward\n    y = self.l(x)\n'
            f'  File "{torch_file}", line 125, in forward\n    return F.linear(x)\n')
    assert stack_site(text) == Site("/work/proj/model.py", 12, "forward")
    assert stack_site(None) is None and stack_site("") is None


def test_break_site_skips_the_tracer_s_own_frames():
    here = os.path.abspath(__file__)
    user = traceback.FrameSummary(here, 7, "step")
    ours = traceback.FrameSummary(os.path.join(os.path.dirname(os.path.dirname(here)),
                                               "memcpy_doctor", "tracer", "modes.py"), 121, "f")
    assert break_site([user, ours]) == Site(here, 7, "step")
    assert break_site([ours]) is None


def test_gb_code_from_the_message_s_link():
    assert gb_code("...please visit: https://meta-pytorch.github.io/compile-graph-break-site/"
                   "gb/gb0124.html") == "GB0124"
    assert gb_code("Graph break GB0036 here") == "GB0036"
    assert gb_code("no code") is None


# ----- the report's section, on hand-built input -----

def _info() -> CompileInfo:
    site = Site("/work/proj/train.py", 50, "train_step")
    return CompileInfo(
        supported=True, recompiles=1,
        graphs=[GraphRecord("Torch-Compiled Region: 0/0", Site("/work/proj/train.py", 48, "f"),
                            nodes=6, host_reads=[Site("/work/proj/train.py", 49, "f")],
                            calls=10)],
        graph_breaks=[GraphBreak(site=site, reason="Unsupported Tensor.item() call",
                                 gb_code="GB0124", graph_calls=10, calls=10,
                                 sync_copies=[BreakCopy("DtoH", "item", 10, 40, 1_000_000)])],
        notes=["a note"])


def test_graph_breaks_section_prices_each_break_per_step():
    lines = compile_lines(_info(), [], 10, "/work/proj", plain_table)
    assert lines == [
        "torch.compile: 1 graph, 1 graph break, 1 recompile",
        "",
        "Site         Calls    Sync per step (10 steps)    Reason",
        "train.py:50  10       DtoH item 1 (0.1 ms)        Unsupported Tensor.item() call [GB0124]",
        "",
        "Host reads captured in compiled graphs:",
        "  train.py:49  in Torch-Compiled Region: 0/0 (10 calls): no sync: the compiled code "
        "keeps the value on the device",
        "Note: a note",
    ]


def test_an_older_torch_says_compiled_code_ran_eagerly():
    info = CompileInfo(supported=False, notes=["torch 2.6.0 cannot ..."])
    assert compile_lines(info, [], None, None, plain_table) == ["torch 2.6.0 cannot ..."]


def test_two_in_graph_reads_each_at_its_own_line(tmp_path):
    trace, _, _ = run_program(tmp_path, """\
        import torch
        torch._dynamo.config.capture_scalar_outputs = True
        @torch.compile(fullgraph=True)
        def step(x):
            n = (x > 0).sum().item()
            m = (x > 2).sum().item()
            torch._check_is_size(n)
            torch._check_is_size(m)
            return torch.zeros(n, device=x.device), torch.ones(m, device=x.device)
        x = torch.arange(-3.0, 7.0, device="cuda")
        for i in range(3):
            a, b = step(x)
        sizes = (len(a), len(b))
        torch._dynamo.config.capture_scalar_outputs = False
        """)
    assert syncs(trace) == [("DtoH", "item", 5, 3), ("DtoH", "item", 6, 3)]


# ----- explain: the fix of a graph break that syncs -----

def _break_trace(tmp_path, trigger: str, gb: str, reason: str) -> tuple[Trace, str]:
    from helpers import make_trace
    from memcpy_doctor.core.trace import CopyRecord
    prog = tmp_path / "train.py"
    prog.write_text("import os\nimport torch\n\n@torch.compile\ndef f(x):\n"
                    "    return x.sum().item()\n")
    site = Site(str(prog), 6, "f")
    copy = CopyRecord(direction="DtoH", sync=True, pinned=False, trigger=trigger, calls=10,
                      bytes=40, host_ns=900_000, device_ns=100_000, site=site, stack=[site],
                      producer=None, consumer=None)
    trace = make_trace(copies=[copy])
    trace.compile = CompileInfo(supported=True, graph_breaks=[GraphBreak(
        site=site, reason=reason, gb_code=gb, graph_calls=10, calls=10)])
    return trace, str(prog)


def test_a_scalar_read_break_gets_the_config_line_as_a_diff(tmp_path):
    from memcpy_doctor.analysis.compile_rules import graph_break_suggestions
    trace, prog = _break_trace(tmp_path, "item", "GB0124",
                               "Unsupported Tensor.item() call with capture_scalar_outputs=False")
    [s] = graph_break_suggestions(trace, cwd=str(tmp_path))
    assert s.title == ("set torch._dynamo.config.capture_scalar_outputs = True for the graph "
                       "break at train.py:6")
    assert s.saving_ns == 900_000 and s.removes == trace.copies and not s.exact
    assert s.apply == {"kind": "line", "file": prog, "line": 2, "old": "import torch",
                       "new": "import torch; torch._dynamo.config.capture_scalar_outputs = "
                              "True  # memcpy-doctor: keep the graph whole"}
    assert "-import torch\n+import torch; torch._dynamo.config.capture_scalar_outputs" in s.diff


def test_a_mask_break_gets_static_shape_advice_without_a_diff(tmp_path):
    from memcpy_doctor.analysis.compile_rules import graph_break_suggestions
    trace, _ = _break_trace(tmp_path, "mask", "GB0036", "Dynamic shape operator")
    [s] = graph_break_suggestions(trace, cwd=str(tmp_path))
    assert s.title == "keep the shape static at train.py:6" and s.diff is None
    assert "capture_dynamic_output_shape_ops = True keeps the graph whole" in s.detail
    assert "torch.where(mask, x, 0)" in s.detail


def test_explain_verify_proves_the_config_fix_by_a_rerun(tmp_path):
    script = tmp_path / "loop.py"
    script.write_text(ITEM_LOOP)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([os.path.dirname(os.path.dirname(
        os.path.abspath(__file__))), os.environ.get("PYTHONPATH", "")])}
    cmd = [sys.executable, "-m", "memcpy_doctor"]
    run = subprocess.run([*cmd, "profile", "loop.py"], capture_output=True, text=True,
                         cwd=tmp_path, env=env)
    assert run.returncode == 0, run.stderr
    assert "loop.py:5  5        DtoH item 1" in run.stderr
    verified = subprocess.run([*cmd, "explain", "memcpy_doctor_trace.json", "--verify",
                               "loop.py"], capture_output=True, text=True, cwd=tmp_path, env=env)
    assert verified.returncode == 0, verified.stderr
    assert ("1. set torch._dynamo.config.capture_scalar_outputs = True for the graph break at "
            "loop.py:5") in verified.stdout
    assert "verified by a re-run with the edit: sync calls 5 -> 0" in verified.stdout


def test_diff_of_an_eager_and_a_compiled_run_names_the_syncs_compiling_removed():
    from helpers import make_trace
    from memcpy_doctor.analysis.compare import compare
    from memcpy_doctor.render.diff import render_diff
    eager = make_trace()
    compiled = make_trace()
    compiled.copies = [c for c in compiled.copies if c.trigger != "item"]
    compiled.compile = CompileInfo(supported=True, graphs=[
        GraphRecord("Torch-Compiled Region: 0/0", None, nodes=3, calls=10)])
    text = render_diff(compare(eager, compiled), "eager.json", "compiled.json", cwd="/work/proj")
    assert "Before: eager (nothing compiled)\nAfter: torch.compile, 1 graph, 0 graph breaks, " \
           "0 recompiles\n" in text
    rows = text.split("Sync copy paths that changed\n")[1].splitlines()
    assert rows[0].split() == ["Copy", "Site", "Calls", "Before", "(ms)", "After", "(ms)", "Why"]
    assert rows[1].split() == ["DtoH", "item", "train.py:50", "10", "->", "0", "1", "0",
                               "removed", "by", "compiling"]
    back = render_diff(compare(compiled, eager), "compiled.json", "eager.json", cwd="/work/proj")
    # the other way round (compiled before, eager after) the read is still one compiling removes
    assert back.split("Sync copy paths that changed\n")[1].splitlines()[1].split()[-3:] == [
        "removed", "by", "compiling"]


def test_cudagraph_skips_are_heard_and_on_the_simulated_gpu_said_to_be_not_simulated(tmp_path):
    import torch._inductor.output_code as output_code
    original = output_code.log_cudagraph_skip_and_bump_counter
    trace, _, _ = run_program(tmp_path, """\
        import torch
        import torch._inductor.output_code as output_code
        f = torch.compile(lambda x: x.cos() * 3)
        f(torch.randn(4, device="cuda"))
        output_code.log_cudagraph_skip_and_bump_counter("skipping cudagraphs due to cpu device")
        """)
    assert output_code.log_cudagraph_skip_and_bump_counter is original  # undone
    assert trace.compile.cudagraph_skips == []  # CUDA graphs were never an option here
    assert trace.compile.notes[0] == ('mode="reduce-overhead": CUDA graphs are not simulated '
                                      "(the simulated GPU's compiled code is CPU code)")


def test_a_torch_that_cannot_keep_code_compiled_runs_it_eagerly_and_says_so(tmp_path,
                                                                           monkeypatch):
    import memcpy_doctor.tracer as tracer_pkg
    from memcpy_doctor.tracer.modes import DispatchMode
    monkeypatch.setattr(tracer_pkg, "compile_hooks", lambda: None)  # as torch 2.6
    monkeypatch.setattr(DispatchMode, "ignore_compile_internals", classmethod(lambda c: False))
    trace, _, _ = run_program(tmp_path, """\
        import torch
        @torch.compile
        def step(x):
            return (x * 2).sum().item()
        x = torch.ones(4, device="cuda")
        for i in range(3):
            step(x)
        """)
    assert {o.op for o in trace.ops} >= {"aten::mul", "aten::sum"}  # op by op
    assert trace.compile.supported is False
    assert trace.compile.notes == [
        f"torch {torch.__version__} cannot run compiled code under a dispatch mode (no "
        "ignore_compile_internals): compiled functions ran eagerly, op by op"]
    assert "compiled functions ran eagerly, op by op" in render_text(trace)


def test_graph_break_code_runs_through_the_tracer_s_handlers_uncompiled(tmp_path):
    # Dynamo compiles frames called from a compiled function's graph-break code: the tracer's
    # own handler among them, were it not kept uncompiled (its reads were then lost, its
    # frames counted as recompiles)
    trace, _, _ = run_program(tmp_path, """\
        import torch
        @torch.compile
        def step(x):
            y = x * 2
            counts = y.sum(1).tolist()
            if y.abs().max() > 10:
                y = y / 10
            return y, counts
        for i in range(3):
            out, counts = step(torch.ones(2, 4, device="cuda") * (i + 1))
        """)
    assert syncs(trace) == [("DtoH", "bool", 6, 3), ("DtoH", "tolist", 5, 3)]
    info = trace.compile
    assert info.recompiles == 0
    assert sorted((b.site.line, b.gb_code, b.calls) for b in info.graph_breaks) == [
        (5, "GB0109", 3), (6, "GB0170", 3)]
    assert [b.reason for b in info.graph_breaks if b.site.line == 6] == [
        "Data-dependent branching (generic_jump TensorVariable())"]


def test_a_graph_of_torch_s_own_code_has_the_caller_s_line(tmp_path):
    trace, path, _ = run_program(tmp_path, """\
        import torch
        net = torch.compile(torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU()).cuda())
        for i in range(2):
            y = net(torch.ones(3, 4, device="cuda"))
        """)
    [region] = [o for o in trace.ops if o.op.startswith("Torch-Compiled Region")]
    assert (region.site.file, region.site.line, region.calls) == (path, 4, 2)
    assert trace.compile.graphs[0].site == region.site


@pytest.mark.cuda
def test_on_a_gpu_the_break_syncs_at_its_line_and_the_captured_read_does_not(tmp_path):
    trace, path, _ = run_program(tmp_path, ITEM_LOOP, device="cuda")
    assert syncs(trace) == [("DtoH", "item", 5, 5)]
    assert sorted(regions(trace).values()) == [5, 5]
    [brk] = trace.compile.graph_breaks
    assert (brk.site.line, brk.gb_code, brk.calls) == (5, "GB0124", 5)
    fused = ITEM_LOOP.replace("import torch\n", "import torch\n"
                              "torch._dynamo.config.capture_scalar_outputs = True\n")
    try:
        trace, _, _ = run_program(tmp_path, fused, name="fused.py", device="cuda")
    finally:
        torch._dynamo.config.capture_scalar_outputs = False
    # what Inductor does with the captured read on a GPU is what this records: kept on the
    # device (no sync), as on the CPU, unless this fails
    assert syncs(trace) == [] and trace.compile.graph_breaks == []


STEADY_LOOP = """\
    import torch, torch.nn as nn
    torch.manual_seed(0)
    model = torch.compile(nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 4)).cuda())
    x = torch.randn(2, 8, device="cuda")
    with torch.no_grad():
        for i in range(10):
            out = model(x)
        total = float(out.sum())
    """


def _op_calls(trace: Trace, name: str) -> int:
    return sum(o.calls for o in trace.ops if o.op == name)


def test_a_quiet_graph_runs_steady_after_its_first_calls_with_the_same_modeled_times(tmp_path):
    """After 3 traced calls without a copy, a graph's calls run untraced inside; on the
    simulated GPU each records its region's row with the time its traced calls modeled for
    the ops inside, so the run's modeled times equal those of tracing every call."""
    steady, _, scope = run_program(tmp_path, STEADY_LOOP)
    every, _, scope_every = run_program(tmp_path, STEADY_LOOP, compiled_calls_traced=None)
    assert scope["total"] == scope_every["total"]
    assert (steady.compile.graphs[0].traced_calls, steady.compile.graphs[0].calls) == (3, 10)
    assert (every.compile.graphs[0].traced_calls, every.compile.graphs[0].calls) == (10, 10)
    assert _op_calls(steady, "aten::addmm") == 2 * 3 and _op_calls(every, "aten::addmm") == 20
    assert regions(steady) == regions(every) == {"Torch-Compiled Region: 0/0": 10}
    device = [sum(o.device_ns for o in t.ops) for t in (steady, every)]
    assert device[0] == device[1] > 0
    assert steady.summary.total_ns == every.summary.total_ns
    text = render_text(steady)
    assert "7 of 10 calls of compiled graphs ran with the ops inside untraced" in text
    assert "ran with the ops inside untraced" not in render_text(every)


TRAIN_LOOP = """\
    import torch, torch.nn as nn
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 4)).cuda()
    compiled = torch.compile(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(2, 8, device="cuda")
    for i in range(10):
        opt.zero_grad()
        compiled(x).square().sum().backward()
        opt.step()
    weight = model[0].weight.detach().cpu()
    """


def test_a_compiled_backward_runs_steady_with_the_same_modeled_times(tmp_path):
    """AOT autograd's backward graph is a region too: after 3 quiet traced calls its calls
    run untraced inside, each recorded as its CompiledFunctionBackward row at the backward()
    line with the time its traced calls modeled, so the weights and the run's modeled times
    are those of tracing every call."""
    steady, _, scope = run_program(tmp_path, TRAIN_LOOP)
    every, _, scope_every = run_program(tmp_path, TRAIN_LOOP, compiled_calls_traced=None)
    assert torch.equal(scope["weight"], scope_every["weight"])
    back = [[g for g in t.compile.graphs if g.name == "CompiledFunctionBackward"]
            for t in (steady, every)]
    assert [(g.traced_calls, g.calls) for g in back[0]] == [(3, 10)]
    assert [(g.traced_calls, g.calls) for g in back[1]] == [(10, 10)]
    per_call = _op_calls(every, "aten::mm") // 10  # the backward's matmuls (3 here)
    assert per_call > 0 and _op_calls(steady, "aten::mm") == 3 * per_call
    rows = [o for o in steady.ops if o.op == "CompiledFunctionBackward"]
    assert [(o.calls, o.device, o.site.line) for o in rows] == [(10, "cuda:0", 9)]
    device = [sum(o.device_ns for o in t.ops) for t in (steady, every)]
    assert device[0] == device[1] > 0
    assert steady.summary.total_ns == every.summary.total_ns


@pytest.mark.cuda
def test_on_a_gpu_a_compiled_backward_runs_steady_and_trains_as_without_the_tool(tmp_path):
    """On a real GPU the engine runs a CUDA backward on a thread of its own: the backward's
    region is found there, goes steady after 3 calls, keeps the backward() line, and the
    weights are those of the same loop run without the tool."""
    steady, _, scope = run_program(tmp_path, TRAIN_LOOP, device="cuda")
    torch._dynamo.reset()
    plain = dict(scope, __name__="__main__")
    exec(compile(textwrap.dedent(TRAIN_LOOP), "plain.py", "exec"), plain)
    torch._dynamo.reset()
    assert torch.allclose(scope["weight"], plain["weight"], rtol=1e-5, atol=1e-6)
    [back] = [g for g in steady.compile.graphs if g.name == "CompiledFunctionBackward"]
    assert (back.traced_calls, back.calls) == (3, 10)
    rows = [o for o in steady.ops if o.op == "CompiledFunctionBackward"]
    assert [(o.calls, o.device, o.site.line) for o in rows] == [(10, "cuda:0", 9)]


def test_a_graph_whose_traced_calls_copy_stays_traced(tmp_path):
    """A graph with a sync inside (an in-graph read that sizes a tensor) never runs steady:
    each call's sync is recorded."""
    trace, _, _ = run_program(tmp_path, IN_GRAPH_READ.format(calls=8))
    assert syncs(trace) == [("DtoH", "item", 5, 8)]
    [graph] = trace.compile.graphs
    assert (graph.traced_calls, graph.calls) == (8, 8)


def test_a_graph_for_any_shape_is_traced_anew_on_new_shapes(tmp_path):
    """A graph compiled for symbolic shapes runs steady per input shapes: each new shape's
    first 3 calls are traced."""
    trace, _, scope = run_program(tmp_path, """\
        import torch
        @torch.compile(dynamic=True)
        def step(x, w):
            return (x @ w).relu()
        w = torch.randn(8, 8, device="cuda")
        for n in (4, 4, 4, 4, 4, 6, 6, 6, 6):
            out = step(torch.randn(n, 8, device="cuda"), w)
        where = str(out.device)
        """)
    assert scope["where"] == "cuda:0"
    [graph] = trace.compile.graphs
    assert (graph.traced_calls, graph.calls) == (6, 9)


def test_trace_compiled_calls_option_is_checked(tmp_path):
    script = tmp_path / "p.py"
    script.write_text("pass\n")
    done = subprocess.run([sys.executable, "-m", "memcpy_doctor", "profile",
                           "--trace-compiled-calls", "0", str(script)],
                          capture_output=True, text=True)
    assert done.returncode == 2
    assert "'0': give a number of calls, at least 1, or 'all'" in done.stderr
    assert "Traceback" not in done.stderr


def test_a_literal_cuda_device_inside_a_compiled_function_runs_on_the_simulated_gpu(tmp_path):
    """Dynamo traces a compiled function on the simulated GPU with every cuda device it names
    made the host (the graph is compiled for the host its tensors live on); the copies between
    devices inside the graph are not simulated, and the report says where they are (not at a
    `.to(x.device)`, most often no move at all)."""
    trace, path, scope = run_program(tmp_path, """\
        import torch
        @torch.compile
        def step(x):
            m = torch.ones(4, device="cuda")
            n = torch.arange(4).cuda()
            k = m.to(x.device)
            return (x * k + n).sum(), x.to("cuda")
        x = torch.arange(4.0, device="cuda")
        for i in range(4):
            s, d = step(x)
        total, where = float(s), {str(s.device), str(d.device)}
        """)
    assert scope["total"] == 12.0 and scope["where"] == {"cuda:0"}
    [graph] = trace.compile.graphs
    assert graph.calls == 4
    assert ("Torch-Compiled Region: 0/0 moves tensors between devices inside the graph (at "
            "prog.py:5, prog.py:7): the simulated GPU compiles it for the host") in \
        " ".join(trace.compile.notes)
