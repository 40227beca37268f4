"""Call sites of ops: each op is recorded at the innermost line of user code that led to it,
also where the tracer finds it without a stack walk (calls into C++, the autograd engine)."""

from __future__ import annotations

import inspect

import torch

import memcpy_doctor


def _line_of(marker: str, fn) -> int:
    lines, start = inspect.getsourcelines(fn)
    return start + next(i for i, text in enumerate(lines) if marker in text)


def _sites(trace, op: str) -> set[int]:
    return {o.site.line for o in trace.ops if o.op == op and o.site is not None}


def _program():
    w = torch.randn(4, 4, requires_grad=True)
    x = torch.randn(4, 4)

    class Scale(torch.autograd.Function):
        @staticmethod
        def forward(ctx, t):
            return t * 3

        @staticmethod
        def backward(ctx, g):
            return torch.flip(g, [0])  # custom-backward

    def hook(g):
        return torch.rot90(g)  # hook-op

    y = torch.mm(x, w)  # forward-mm
    y.register_hook(hook)
    z = Scale.apply(y)
    z.sum().backward()  # backward-call


def test_ops_are_at_the_user_line_forward_and_backward():
    with memcpy_doctor.profiler(device="sim") as prof:
        _program()
    trace = prof.trace
    assert _sites(trace, "aten::mm") == {_line_of("forward-mm", _program),
                                         _line_of("backward-call", _program)}
    assert _sites(trace, "aten::flip") == {_line_of("custom-backward", _program)}
    assert _sites(trace, "aten::rot90") == {_line_of("hook-op", _program)}
    # the backward of sum (expand) runs in the engine with no Python between
    assert _line_of("backward-call", _program) in _sites(trace, "aten::expand")


def test_ops_inside_torch_python_code_are_at_the_calling_line():
    layer = torch.nn.Linear(4, 4)

    def run():
        return torch.nn.functional.layer_norm(layer(torch.randn(2, 4)), (4,))  # the-line

    with memcpy_doctor.profiler(device="sim") as prof:
        run()
    line = _line_of("the-line", run)
    ops = [o for o in prof.trace.ops if o.op in ("aten::addmm", "aten::native_layer_norm")]
    assert {o.op for o in ops} == {"aten::addmm", "aten::native_layer_norm"}
    assert {o.site.line for o in ops} == {line}


def test_the_programs_own_function_mode_and_subclass_see_only_the_programs_calls():
    """The tracer reads its own facts about tensors (sizes, storages) with torch functions
    off, so a function mode or a subclass's __torch_function__ of the program sees what it
    would see without the tracer."""
    from torch.overrides import TorchFunctionMode

    seen = []

    class Logged(torch.Tensor):
        @classmethod
        def __torch_function__(cls, func, types, args=(), kwargs=None):
            seen.append(("subclass", getattr(func, "__name__", str(func))))
            return super().__torch_function__(func, types, args, kwargs or {})

    class Counting(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            seen.append(("mode", getattr(func, "__name__", str(func))))
            return func(*args, **(kwargs or {}))

    def program():
        x = torch.ones(4).as_subclass(Logged).requires_grad_()
        y = (x * x + x).sum()
        y.backward()
        with Counting():
            z = torch.ops.aten.mul.Tensor(torch.ones(3), 2)  # dispatched under the mode
        return float(y.detach()), x.grad.tolist(), z.tolist()

    result = program()
    assert result == (8.0, [3.0] * 4, [2.0] * 3)
    expected = list(seen)
    seen.clear()
    with memcpy_doctor.profiler(device="sim"):
        assert program() == result
    assert seen == expected


def _grad_program():
    x = torch.randn(4, 4, requires_grad=True)
    y = torch.mm(x, x)
    y.register_hook(lambda g: torch.rot90(g))  # hook-in-grad
    (g,) = torch.autograd.grad(y.sum(), [x])  # grad-call
    try:
        torch.nn.functional.layer_norm(x, (5,))  # raises-inside
    except RuntimeError:
        pass
    return torch.flip(g, [0])  # after-both


def test_ops_inside_a_torch_python_call_that_runs_user_code_again():
    """torch.autograd.grad is torch code in Python: the engine's ops inside it are at the
    line that called it, a hook it runs at the hook's line, and once it (or a call that
    raised) returns, ops are at their own lines again."""
    with memcpy_doctor.profiler(device="sim") as prof:
        _grad_program()
    trace = prof.trace
    grad_line = _line_of("grad-call", _grad_program)
    assert _sites(trace, "aten::mm") == {_line_of("y = torch.mm", _grad_program), grad_line}
    assert grad_line in _sites(trace, "aten::expand")  # sum's backward, in the engine
    assert _sites(trace, "aten::rot90") == {_line_of("hook-in-grad", _grad_program)}
    assert _sites(trace, "aten::flip") == {_line_of("after-both", _grad_program)}


def _layers_program(layer):
    x = torch.randn(2, 4)
    a = layer(x)  # first-call
    with torch.no_grad():  # torch's code switches grad off: a call into C++ with no op
        b = layer(a)  # second-call
    return layer(b)  # third-call


def test_each_call_into_cpp_from_torch_code_is_at_its_own_line():
    """nn.Linear calls F.linear (C++) from torch's code: the ops of each call are at the
    user line that led to that call, found once per call, and no call's site outlives it."""
    layer = torch.nn.Linear(4, 4)
    with memcpy_doctor.profiler(device="sim") as prof:
        _layers_program(layer)
    addmm = [o for o in prof.trace.ops if o.op == "aten::addmm"]
    assert sorted((o.site.line, o.calls) for o in addmm) == [
        (_line_of(marker, _layers_program), 1)
        for marker in ("first-call", "second-call", "third-call")]


def test_a_call_into_cpp_from_torch_code_keeps_no_frame_alive():
    """The tracer holds the frame that called into C++ only while the call runs: once the
    caller returns, its locals are freed."""
    import os
    import weakref

    torch_file = os.path.join(os.path.dirname(torch.__file__), "memcpy_doctor_test_frame.py")
    code = compile("def caller(t):\n"
                   "    kept = t * 2\n"
                   "    torch._C._set_grad_enabled(True)\n"
                   "    torch.relu(kept)\n"
                   "    return weakref.ref(kept)\n", torch_file, "exec")
    namespace = {"torch": torch, "weakref": weakref}
    exec(code, namespace)  # a function the tracer takes for torch's own code
    with memcpy_doctor.profiler(device="sim"):
        ref = namespace["caller"](torch.ones(3))
        assert ref() is None


def test_a_copys_stack_stops_at_the_users_script(tmp_path):
    """`memcpy-doctor profile SCRIPT` runs the script from its runner, under click: no frame
    of either is in any copy's stack, in full or light mode (issue 41)."""
    import json
    import subprocess
    import sys

    script = tmp_path / "s.py"
    script.write_text("import torch\n\ndef f(t):\n    return t.sum().item()\n\n"
                      "x = torch.ones(3, device='cuda')\nf(x)\ny = x.cpu()\n")
    for light in ([], ["--light", "--device", "sim"]):
        out = tmp_path / "t.json"
        done = subprocess.run([sys.executable, "-m", "memcpy_doctor", "profile", "--no-report",
                               *light, "-o", str(out), str(script)],
                              capture_output=True, text=True, cwd=tmp_path)
        assert done.returncode == 0, done.stderr
        copies = json.loads(out.read_text())["copies"]
        assert copies
        for c in copies:
            assert {s["file"] for s in c["stack"]} == {str(script)}, (light, c["stack"])
