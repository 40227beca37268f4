"""Sites, producers and consumers of a torch.profiler trace (kineto/stacks.py): Python
frames of a `with_stack=True` profile name the user's function; the producer is the op whose
kernel ran last on the copy's stream, the consumer the op around the trigger, both labelled
inferred; without stacks, explain says a with_stack=True profile would name the lines."""

from __future__ import annotations

import json
import subprocess
import sys

from memcpy_doctor.analysis.attribution import explain, user_site
from memcpy_doctor.core.defaults import NO_STACK_NOTE
from memcpy_doctor.kineto.reader import SITES_NOTE, from_kineto
from memcpy_doctor.kineto.frames import frame_site
from memcpy_doctor.core.trace import OpRef, Site

LIB = "/opt/venv/lib/python3.11/site-packages/mylib/loop.py"


def _x(cat: str, name: str, ts: float, dur: float, **args) -> dict:
    return {"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": 1, "ts": ts, "dur": dur,
            "args": args}


def _dev(cat: str, name: str, ts: float, dur: float, corr: int, **args) -> dict:
    return {"ph": "X", "cat": cat, "name": name, "pid": 0, "tid": 7, "ts": ts, "dur": dur,
            "args": {"correlation": corr, "stream": 7, **args}}


def stack_trace(with_stack: bool = True) -> dict:
    """train.py: step() sums on the device and reads the sum with .item(), then calls
    torch.nonzero inside an index op, inside mylib's loop; an upload read by a matmul."""
    events = [
        _x("cpu_op", "aten::sum", 10, 10),
        _x("cuda_runtime", "cudaLaunchKernel", 12, 4, correlation=1),
        _dev("kernel", "reduce_kernel", 20, 5, 1),
        _x("cpu_op", "aten::item", 30, 40), _x("cpu_op", "aten::_local_scalar_dense", 31, 38),
        _x("cuda_runtime", "cudaMemcpyAsync", 32, 4, correlation=2),
        _dev("gpu_memcpy", "Memcpy DtoH (Device -> Pageable)", 36, 2, 2, bytes=4),
        _x("cuda_runtime", "cudaStreamSynchronize", 40, 6, correlation=3),
        _x("cpu_op", "aten::index", 100, 50), _x("cpu_op", "aten::nonzero", 101, 40),
        _x("cuda_runtime", "cudaMemcpyAsync", 105, 4, correlation=4),
        _dev("gpu_memcpy", "Memcpy DtoH (Device -> Pageable)", 110, 2, 4, bytes=8),
        _x("cuda_runtime", "cudaStreamSynchronize", 112, 6, correlation=5),
        _x("cpu_op", "aten::to", 200, 20), _x("cpu_op", "aten::copy_", 201, 18),
        _x("cuda_runtime", "cudaMemcpyAsync", 202, 10, correlation=6),
        _dev("gpu_memcpy", "Memcpy HtoD (Pageable -> Device)", 203, 8, 6, bytes=4096),
        _x("cuda_runtime", "cudaStreamSynchronize", 213, 4, correlation=7),
        _x("cpu_op", "aten::mm", 230, 10),
        _x("cuda_runtime", "cudaLaunchKernel", 232, 4, correlation=8),
        _dev("kernel", "gemm", 240, 30, 8),
    ]
    if with_stack:
        events += [
            _x("python_function", "train.py(20): <module>", 0, 300),
            _x("python_function", "train.py(3): step", 5, 80),
            _x("python_function", "<built-in method item of Tensor object at 0x1>", 29, 42),
            _x("python_function", f"{LIB}(7): run", 95, 60),
            _x("python_function", "torch/functional.py(50): nonzero_wrapper", 99, 52),
            _x("python_function", "enum.py(12): __hash__", 199, 1),
        ]
    return {"schemaVersion": 1, "deviceProperties": [{"name": "NVIDIA A100-SXM4-80GB"}],
            "traceEvents": events}


def test_frames_name_the_users_function_and_skip_torch_builtins_and_the_stdlib():
    assert frame_site("train.py(3): step") == Site("train.py", 3, "step")
    assert frame_site(f"{LIB}(7): run") == Site(LIB, 7, "run")
    assert frame_site("pytest/main.py(9): run") == Site("site-packages/pytest/main.py", 9,
                                                        "run")  # installed here: a library
    for name in ("torch/nn/modules/module.py(1501): _call_impl", "enum.py(12): __hash__",
                 "<built-in method item of Tensor object at 0x1>", "nn.Module: Linear_0",
                 "/x/site-packages/torch/autograd/grad_mode.py(80): wrapper"):
        assert frame_site(name) is None


def test_sites_producers_and_consumers_map_exactly():
    t = from_kineto(stack_trace(), "k.json")
    step, module = Site("train.py", 3, "step"), Site("train.py", 20, "<module>")
    lib = Site(LIB, 7, "run")
    got = {c.trigger: (c.site, c.stack, c.producer, c.consumer) for c in t.copies}
    assert got["item"] == (step, [step, module],
                           OpRef("aten::sum (inferred)", "cuda", step), None)
    # made inside a library: the site is its frame, the user's line follows in the stack
    assert got["nonzero"] == (lib, [lib, module],
                              OpRef("aten::sum (inferred)", "cuda", step),
                              OpRef("aten::index (inferred)", "cpu", lib))
    # an upload's consumer is not guessed: the next kernel on its stream need not read it
    assert got["to"] == (module, [module], None, None)
    assert [user_site(c) for c in t.copies if c.trigger == "nonzero"] == [module]
    assert SITES_NOTE in t.meta.untraced and NO_STACK_NOTE not in t.meta.untraced
    assert [(c.trigger, c.first_ns) for c in t.copies] == [
        ("item", 32_000), ("nonzero", 105_000), ("to", 202_000)]
    assert explain(t).notes == []


def test_without_stacks_explain_says_with_stack_would_name_lines(tmp_path):
    t = from_kineto(stack_trace(with_stack=False), "k.json")
    assert all(c.site is None and c.stack == [] for c in t.copies)
    assert explain(t).notes == [NO_STACK_NOTE]
    (tmp_path / "k.json").write_text(json.dumps(stack_trace(with_stack=False)))
    r = subprocess.run([sys.executable, "-m", "memcpy_doctor", "explain", "k.json"],
                       cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert ("Note: call sites: the profile has no Python stacks; a torch.profiler profile "
            "recorded with with_stack=True would name the lines") in r.stdout.splitlines()
