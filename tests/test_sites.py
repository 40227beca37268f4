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
