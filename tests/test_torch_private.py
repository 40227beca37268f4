"""PyTorch's private APIs that memcpy-doctor uses, each checked for what the code expects of
it: present, called the way the code calls it, and answering as the code reads the answer.
A torch release that renames or changes one fails here by name, before any trace is wrong.

Most go through core/torch_private.py; the rest are used in place by the tracer and the
simulated GPU (the module that uses each is named beside it). The CUDA-only ones are checked
on a CUDA build of torch (a GPU is not needed). dynamo_skip_frame is left to the tracer's
tests, which call it in every trace: here it would import torch._dynamo (over a second)."""

from __future__ import annotations

import inspect
import os
import pathlib
import re
import sys

import pytest
import torch

from memcpy_doctor.core import torch_private as tp

aten = torch.ops.aten
CUDA_BUILD = torch.version.cuda is not None


class PassThrough(tp.TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


class PassThroughDispatch(tp.TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


def test_every_exported_name_is_there():
    missing = [name for name in tp.__all__ if getattr(tp, name, None) is None]
    assert missing == []


MAJOR, MINOR = tp.OLDEST_TORCH


@pytest.mark.parametrize("version, too_old", [
    (f"{MAJOR}.{MINOR - 1}.1+cu121", True), (f"{MAJOR - 1}.13.1", True),
    (f"{MAJOR}.{MINOR}.0", False), (f"{MAJOR}.{MINOR}.0a0+git1234", False),
    (f"{MAJOR}.{MINOR + 5}.0+cu130", False), (f"{MAJOR + 1}.0.0", False)])
def test_an_older_torch_is_refused_in_one_line(version, too_old):
    if too_old:
        with pytest.raises(ImportError) as raised:
            tp.check_torch_version(version)
        assert str(raised.value) == (f"memcpy-doctor needs torch {MAJOR}.{MINOR} or newer; "
                                     f"this is torch {version}")
    else:
        tp.check_torch_version(version)


def test_the_running_torch_is_accepted_and_the_package_claims_the_same_oldest():
    tp.check_torch_version(torch.__version__)
    pyproject = pathlib.Path(__file__).resolve().parent.parent / "pyproject.toml"
    claimed = re.findall(r'"torch>=(\d+)\.(\d+)"', pyproject.read_text())
    assert claimed == [(str(MAJOR), str(MINOR))]


def test_set_eval_frame_returns_the_prior_callback_and_restores_it():
    # tracer/perop.py and sim/session.py: `prior = set_eval_frame(None)` ... `set_eval_frame(
    # prior)` around the tracer's own code
    prior = tp.set_eval_frame(None)
    assert tp.set_eval_frame(prior) is None
    assert tp.set_eval_frame(prior) is prior


def test_a_dispatch_mode_can_opt_out_of_the_dynamo_wrapper():
    # tracer/modes.py and sim/session.py: `_should_skip_dynamo` returning False keeps the
    # subclass's __torch_dispatch__ as written (torch wraps it in torch._dynamo.disable else)
    def raw(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))

    class OptedOut(tp.TorchDispatchMode):
        @classmethod
        def _should_skip_dynamo(cls) -> bool:
            return False

        __torch_dispatch__ = raw

    assert OptedOut.__dict__["__torch_dispatch__"] is raw
    assert OptedOut()._should_skip_dynamo() is False


def test_engine_run_backward_is_the_frame_a_backward_pass_runs_under():
    # tracer/context.py: ops in backward find the user's line above this frame
    assert inspect.iscode(tp.ENGINE_RUN_BACKWARD)
    codes = []

    def hook(grad):
        frame = sys._getframe()
        while frame is not None:
            codes.append(frame.f_code)
            frame = frame.f_back
        return grad

    x = torch.ones(3, requires_grad=True)
    y = x * 2
    y.register_hook(hook)
    y.sum().backward()
    assert tp.ENGINE_RUN_BACKWARD in codes


def test_default_device_type_reads_the_device_context_and_the_global_default():
    assert tp.default_device_type() == "cpu"
    with torch.device("meta"):
        assert tp.default_device_type() == "meta"
    assert tp.default_device_type() == "cpu"
    context = torch._GLOBAL_DEVICE_CONTEXT
    had = hasattr(context, "device_context")
    torch.set_default_device("meta")
    try:
        assert tp.default_device_type() == "meta"
    finally:
        torch.set_default_device(None)
        if not had:  # as before: torch 2.6's get_default_device fails on the None left here
            del context.device_context
    assert tp.default_device_type() == "cpu"
    assert hasattr(context, "device_context") == had


def test_device_constructors_are_the_factory_functions():
    # guards/device_calls.py: the calls that take a device= argument
    constructors = tp._device_constructors()
    assert {torch.empty, torch.zeros, torch.ones, torch.tensor, torch.arange} <= constructors
    assert torch.add not in constructors


def test_parse_to_answers_device_dtype_non_blocking_memory_format():
    # sim/device.py and guards/device_modules.py unpack these four
    assert tp._parse_to is torch._C._nn._parse_to
    assert tp._parse_to("cpu", torch.float16) == (torch.device("cpu"), torch.float16, False,
                                                  None)
    assert tp._parse_to(torch.float64) == (None, torch.float64, False, None)
    assert tp._parse_to("meta", non_blocking=True, memory_format=torch.channels_last) == (
        torch.device("meta"), None, True, torch.channels_last)


def test_disable_current_modes_takes_the_dispatch_modes_off_and_puts_them_back():
    # sim/device.py, around torch's own tensor formatting
    with PassThroughDispatch():
        assert torch._C._len_torch_dispatch_stack() == 1
        with tp._disable_current_modes():
            assert torch._C._len_torch_dispatch_stack() == 0
        assert torch._C._len_torch_dispatch_stack() == 1
    assert torch._C._len_torch_dispatch_stack() == 0


def test_mode_stacks_push_pop_and_count():
    # sim/session.py's _Stack: set the modes aside while the pytest plugin's session pauses
    mode = PassThrough()
    torch._C._push_on_torch_function_stack(mode)
    assert torch._C._len_torch_function_stack() == 1
    assert torch._C._pop_torch_function_stack() is mode
    assert torch._C._len_torch_function_stack() == 0

    mode = PassThroughDispatch()
    torch._C._push_on_torch_dispatch_stack(mode)
    assert torch._C._len_torch_dispatch_stack() == 1
    assert torch._C._pop_torch_dispatch_stack(None) is mode
    assert torch._C._len_torch_dispatch_stack() == 0


def test_torch_function_checks():
    # tracer/perop.py and sim/session.py: DisableTorchFunction only where a mode could see it
    assert torch._C._has_torch_function((torch.ones(1),)) is False
    x = torch.ones(1)
    with PassThrough():
        assert torch._C._has_torch_function((x,)) is True
        with torch._C.DisableTorchFunction():
            assert torch._C._has_torch_function((x,)) is False


def test_flop_registry_formulas_take_the_op_arguments_and_out_val():
    # tracer/optable.py: formula(*args, **kwargs, out_val=out), keyed by overload packet
    a, b = torch.ones(2, 3), torch.ones(3, 4)
    assert aten.mm in tp.flop_registry
    assert tp.flop_registry[aten.mm](a, b, out_val=a @ b) == 2 * 2 * 3 * 4


def test_op_overload_attributes_the_op_table_reads():
    # tracer/optable.py: the packet, its name, the schema's arguments, the C callable
    from torch._ops import OpOverload

    func = aten.add.Tensor
    assert isinstance(func, OpOverload)
    assert func._overloadpacket is aten.add and func._overloadpacket.__name__ == "add"
    assert func.namespace == "aten"
    assert [a.name for a in func._schema.arguments][:2] == ["self", "other"]
    assert type(func).__call__ is OpOverload.__call__
    assert torch.equal(func._op(torch.ones(2), torch.ones(2)), torch.full((2,), 2.0))
    assert aten.view.default.is_view and not func.is_view


def test_group_tensors_by_device_and_dtype_answers_as_the_patch_reads_it():
    # sim/torchlib.py wraps it: {(device, dtype): (lists, indices)}
    a, b, c = torch.ones(2), torch.ones(3), torch.ones(2, dtype=torch.float64)
    grouped = torch._C._group_tensors_by_device_and_dtype([[a, b, c]], True)
    lists, indices = grouped[(torch.device("cpu"), torch.float32)]
    assert lists[0][0] is a and lists[0][1] is b and list(indices) == [0, 1]
    lists, indices = grouped[(torch.device("cpu"), torch.float64)]
    assert lists[0][0] is c and list(indices) == [2]
    assert len(grouped) == 2


def test_dispatch_key_guard_and_tensor_printing():
    # sim/autocast.py and sim/device.py
    keys = torch._C.DispatchKeySet(torch._C.DispatchKey.AutocastCPU)
    with torch._C._ExcludeDispatchKeyGuard(keys):
        assert torch.ones(1).add(1).item() == 2.0
    guard = torch._C._DisableFuncTorch()  # noqa: F841
    text = torch._tensor_str._str_intern(torch.ones(2), tensor_contents=None)
    assert text.startswith("tensor([1., 1.]")


def test_generator_class_can_be_subclassed_with_its_metaclass():
    # sim/torchlib.py's SimGenerator
    class Meta(type(torch._C.Generator)):
        pass

    class Gen(torch._C.Generator, metaclass=Meta):
        pass

    assert isinstance(Gen("cpu"), torch.Generator)


def test_module_level_hooks_the_simulated_gpu_replaces():
    # sim/marks.py patches these on torch.cuda; sim/torchlib.py the rest
    from torch.cuda import nvtx
    from torch.utils._pytree import tree_map_only
    from torch.utils.data._utils import pin_memory

    for name in ("_lazy_init", "_exchange_device", "_maybe_exchange_device"):
        assert callable(getattr(torch.cuda, name)), name
    assert hasattr(nvtx, "_nvtx")
    assert list(inspect.signature(pin_memory.pin_memory).parameters) == ["data", "device"]
    assert tree_map_only(torch.Tensor, lambda t: t + 1, {"a": [torch.zeros(1)]})["a"][0] == 1
    assert callable(torch._pack_padded_sequence) and callable(torch._pad_packed_sequence)
    assert hasattr(torch, "accelerator")  # (public, but only from torch 2.6)


def test_torch_files_the_traceback_filter_skips_exist():
    # run/runner.py's _PLUMBING: torch's mode machinery between the user's line and the
    # tracer's handlers, left out of a script's traceback
    from memcpy_doctor.run.runner import _PLUMBING

    root = os.path.dirname(os.path.dirname(torch.__file__))
    for part in _PLUMBING:
        assert os.path.exists(os.path.join(root, part)), part


def test_gpu_trace_registries_the_sync_hooks_use():
    # tracer/cuda_hooks.py SyncHooks: add_callback and callback_list on the three registries
    assert tp.gpu_trace is not None
    for name in ("StreamSynchronizationCallbacks", "DeviceSynchronizationCallbacks",
                 "EventSynchronizationCallbacks"):
        registry = getattr(tp.gpu_trace, name)
        assert callable(registry.add_callback) and isinstance(registry.callback_list, list)
    assert callable(torch._C._activate_gpu_trace)


@pytest.mark.skipif(not CUDA_BUILD, reason="a CPU build of torch has no CUDA bindings")
def test_cuda_bindings_the_real_gpu_path_calls():
    # tracer/cuda_hooks.py (drains), cuda_timer.py (capture check), run/calibrate.py
    for name in ("_cuda_synchronize", "_cuda_isCurrentStreamCapturing"):
        assert callable(getattr(torch._C, name)), name
    assert callable(torch._C._CudaStreamBase.synchronize)
    assert callable(torch.cuda._sleep) and callable(torch.cuda.ExternalStream)


def test_storage_id_names_a_storage_and_every_view_of_it():
    # tracer/events.py numbers storages by it
    a, b = torch.ones(8), torch.ones(8)
    assert tp.storage_id(a) == tp.storage_id(a[2:]) == tp.storage_id(a.view(2, 4))
    assert tp.storage_id(a) != tp.storage_id(b)
    assert tp.storage_id(a) == a.untyped_storage()._cdata
    with pytest.raises((RuntimeError, NotImplementedError, TypeError)):  # tensors.NO_STORAGE
        tp.storage_id(torch.ones(2).to_sparse())
