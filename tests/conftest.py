"""Shared fixtures. Every test fails if it leaves a tracer (full or light), a torch mode, a
patch or light mode's warnings filter behind."""

from __future__ import annotations

import os
import pathlib

import pytest

pytest.register_assert_rewrite("triggers_util", "helpers")

import torch  # noqa: E402

import warnings  # noqa: E402

from memcpy_doctor.tracer import active_tracer  # noqa: E402
from memcpy_doctor.tracer.light import LightHooks, filters_changed  # noqa: E402

_ORIGINAL_CUDA = {name: getattr(torch.cuda, name) for name in
                  ("is_available", "synchronize", "device_count", "Stream", "Event")}
#: What light mode wraps (tracer/light.py), beside torch.cuda.synchronize above.
_ORIGINAL_METHODS = [(torch.cuda.Stream, "synchronize"), (torch.cuda.Event, "synchronize")]
_ORIGINAL_METHODS = {(cls, name): vars(cls)[name] for cls, name in _ORIGINAL_METHODS}
_ORIGINAL_GROUPING = torch._C._group_tensors_by_device_and_dtype
_ORIGINAL_SERIALIZERS = list(torch.serialization._package_registry)

# The tests' subprocesses (`python -m memcpy_doctor` in a temporary folder) import the package
# from this checkout also where it is not installed: a lent GPU machine's python3 runs the
# suite from a copy of the tree (benchmarks/gpu_run.sh). Where it is installed from this
# checkout, the entry changes nothing.
_ROOT = str(pathlib.Path(__file__).resolve().parent.parent)
os.environ["PYTHONPATH"] = os.pathsep.join(
    [_ROOT] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and p != _ROOT])


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a real CUDA GPU")
    for item in items:
        if item.get_closest_marker("cuda") is not None:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def no_tracer_left_behind():
    yield
    problems = []
    tracer = active_tracer()
    if tracer is not None:
        problems.append("a memcpy-doctor tracer is still active")
        tracer.stop()
    if torch._C._len_torch_function_stack():
        problems.append("a TorchFunctionMode is still on the stack")
    if torch._C._len_torch_dispatch_stack():
        problems.append("a TorchDispatchMode is still on the stack")
    for name, original in _ORIGINAL_CUDA.items():
        if getattr(torch.cuda, name) is not original:
            problems.append(f"torch.cuda.{name} is still patched")
            setattr(torch.cuda, name, original)
    for (cls, name), original in _ORIGINAL_METHODS.items():
        if vars(cls)[name] is not original:
            problems.append(f"{cls.__name__}.{name} is still patched")
            setattr(cls, name, original)
    if "copy_" in vars(torch.Tensor):
        problems.append("torch.Tensor.copy_ is still patched")
        del torch.Tensor.copy_
    ours = [f for f in warnings.filters if LightHooks.owns(f)]
    if ours:
        problems.append("light mode's warnings filter is still installed")
        warnings.filters[:] = [f for f in warnings.filters if not LightHooks.owns(f)]
        filters_changed()
    if torch.cuda.is_available() and torch.cuda.get_sync_debug_mode() != 0:
        problems.append("CUDA sync-debug mode is still armed")
        torch.cuda.set_sync_debug_mode(0)
    if torch._C._group_tensors_by_device_and_dtype is not _ORIGINAL_GROUPING:
        problems.append("torch._C._group_tensors_by_device_and_dtype is still patched")
        torch._C._group_tensors_by_device_and_dtype = _ORIGINAL_GROUPING
    if torch.Generator is not torch._C.Generator:
        problems.append("torch.Generator is still patched")
        torch.Generator = torch._C.Generator
    if torch.serialization._package_registry != _ORIGINAL_SERIALIZERS:
        problems.append("torch.serialization's registry still holds the tracer's entry")
        torch.serialization._package_registry[:] = _ORIGINAL_SERIALIZERS
    if problems:
        pytest.fail("; ".join(problems))


@pytest.fixture(autouse=True)
def default_device_as_found():
    """A program run in-process may call torch.set_default_device(None): torch 2.6 then keeps
    a None context, which its get_default_device() fails on in every later test of the worker
    (transformers calls it). What the test found is put back."""
    yield
    context = torch._GLOBAL_DEVICE_CONTEXT
    if getattr(context, "device_context", 1) is None:
        del context.device_context
