"""The ops that make the host wait for the device inside their CUDA code, and what each copies.

This is the table docs/cuda-sync-points.md describes row by row, with the line of PyTorch's
(or torchvision's) source each row stands on. A rule is evaluated on the op's own arguments:
`reads(args, kwargs, out)` lists the copies the op makes with these arguments, as
(direction, tensor, bytes). A DtoH copy is made only where its tensor lives on the device
(a value passed as a host tensor is read without a wait); an HtoD copy (an op that builds
something on the host and sends it over) where its tensor, the op's output, does. Only the
ops named here pay for this: the per-op path calls a rule for them alone (`OpInfo.reads`),
never for the rest.

`BACKWARD_RULES` are the reads of backward formulas, listed by the forward op they belong to
and recorded when autograd runs its node (tracer/backward.py). Users declare their own ops
with `optable.register_sync_op` (exported as `memcpy_doctor.register_sync_op`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch

Tensor = torch.Tensor
#: One copy an op makes: (direction, the tensor read or written, bytes).
Read = tuple[str, Tensor, int]

#: `isin` sorts (making each side unique first, which reads its size back) unless
#: elements.numel() < ISIN_SORT_FACTOR * test_elements.numel() ** ISIN_SORT_POWER: PyTorch's
#: heuristic, taken from NumPy's (aten/src/ATen/native/TensorCompare.cpp).
ISIN_SORT_FACTOR, ISIN_SORT_POWER = 10.0, 0.145


@dataclass(frozen=True)
class SyncRule:
    """What one op copies between device and host inside its own code."""

    trigger: str  # the name the copy is recorded under
    reads: Callable[[tuple, dict, Any], list[Read]]


#: What an op that sizes its output by a count (nonzero, a mask) reads back: one int32.
COUNT_BYTES = 4


def _count(t: Tensor) -> list[Read]:
    return [("DtoH", t, COUNT_BYTES)]


def _scalar(args: tuple, kwargs: dict, out: Any) -> list[Read]:
    return [("DtoH", args[0], args[0].element_size())]


def _nonzero(args: tuple, kwargs: dict, out: Any) -> list[Read]:
    return _count(args[0])


def _masked_select(args: tuple, kwargs: dict, out: Any) -> list[Read]:
    return _count(args[1])  # the count of the mask's true elements


def _unique(args: tuple, kwargs: dict, out: Any) -> list[Read]:
    return [("DtoH", args[0], 8)]  # the number of unique values


def _bool_result(args: tuple, kwargs: dict, out: Any) -> list[Read]:
    return [("DtoH", args[0], 1)]


def _tensor_value(index: int) -> Callable[[tuple, dict, Any], list[Read]]:
    """A fill op whose value, passed as a tensor, is read with `value.item()`."""
    def reads(args: tuple, kwargs: dict, out: Any) -> list[Read]:
        value = args[index] if len(args) > index else kwargs.get("value")
        if isinstance(value, Tensor):
            return [("DtoH", value, value.element_size())]
        return []
    return reads


def _histc(args: tuple, kwargs: dict, out: Any) -> list[Read]:
    self = args[0]
    low = args[2] if len(args) > 2 else kwargs.get("min", 0)
    high = args[3] if len(args) > 3 else kwargs.get("max", 0)
    if low != high or self.numel() == 0:
        return []
    return [("DtoH", self, self.element_size())] * 2  # its minimum, then its maximum


def _bincount(args: tuple, kwargs: dict, out: Any) -> list[Read]:
    self = args[0]
    if self.numel() == 0:
        return []
    size = self.element_size()
    if self.dtype == torch.uint8:
        return [("DtoH", self, size)]  # its maximum (an unsigned input needs no minimum)
    return [("DtoH", self, size)] * 2  # its minimum (checked >= 0), then its maximum


def _repeat_interleave(args: tuple, kwargs: dict, out: Any) -> list[Read]:
    # only the `repeats`-only overload sizes its output from the device, and only untold
    if len(args) != 1 or kwargs.get("output_size") is not None:
        return []
    return [("DtoH", args[0], 8)]


def _check_errors(args: tuple, kwargs: dict, out: Any) -> list[Read]:
    return [("DtoH", args[0], 1)]  # infos.any().item(): whether any matrix failed


def _batch(a: Tensor) -> int:
    """The number of matrices in a batch of them (one LAPACK info each)."""
    return a.numel() // (a.shape[-1] * a.shape[-2]) if a.dim() >= 2 and a.numel() else 1


def _svd(args: tuple, kwargs: dict, out: Any) -> list[Read]:
    # cuSOLVER's iterative drivers' convergence (each matrix's info), then the error check
    return [("DtoH", args[0], 4 * _batch(args[0])), ("DtoH", args[0], 1)]


def _pinv(args: tuple, kwargs: dict, out: Any) -> list[Read]:
    hermitian = args[3] if len(args) > 3 else kwargs.get("hermitian", False)
    return _check_errors(args, kwargs, out) if hermitian else _svd(args, kwargs, out)


#: torch from which multinomial checks its probabilities with `_assert_async` (a device-side
#: assert on CUDA: no read; PyTorch #134818, in 2.5) instead of two `.item()` reads.
_MULTINOMIAL_ASSERTS = tuple(int(v) for v in torch.__version__.split(".")[:2]) >= (2, 5)


def _multinomial(args: tuple, kwargs: dict, out: Any) -> list[Read]:
    samples = args[1] if len(args) > 1 else kwargs.get("num_samples")
    replacement = args[2] if len(args) > 2 else kwargs.get("replacement", False)
    if _MULTINOMIAL_ASSERTS or (replacement and samples != 1):
        return []
    probs = args[0]
    # whether every probability is finite and >= 0, then whether any row sums to zero
    return [("DtoH", probs, 1), ("DtoH", probs, 1 if probs.dim() == 1 else 8)]


def _isin(args: tuple, kwargs: dict, out: Any) -> list[Read]:
    elements, test = args[0], args[1]
    if not isinstance(elements, Tensor) or not isinstance(test, Tensor):
        return []  # a scalar on one side: an elementwise comparison
    if elements.numel() < ISIN_SORT_FACTOR * test.numel() ** ISIN_SORT_POWER:
        return []  # few elements: compared one by one, on the device
    assume_unique = args[2] if len(args) > 2 else kwargs.get("assume_unique", False)
    if assume_unique:
        return []
    return [("DtoH", elements, 8), ("DtoH", test, 8)]  # each side made unique first


def _ctc_lengths(args: tuple, kwargs: dict, out: Any) -> list[Read]:
    return [("DtoH", t, t.nbytes) for t in args[2:4] if isinstance(t, Tensor)]


def _from_mask(args: tuple, kwargs: dict, out: Any) -> list[Read]:
    mask = args[1]
    return [("DtoH", mask, 16 * (mask.shape[0] if mask.dim() else 1))]  # each row's sizes


def _left_aligned(args: tuple, kwargs: dict, out: Any) -> list[Read]:
    return [("DtoH", args[1], 1)]


def _tensor_ends(args: tuple, kwargs: dict, out: Any) -> list[Read]:
    # linspace/logspace with 0-dim tensor ends: `start.item()`, `end.item()` (the Scalar
    # overloads take numbers, read nothing)
    ends = args[:2] if len(args) >= 2 else (kwargs.get("start"), kwargs.get("end"))
    return [("DtoH", t, t.element_size()) for t in ends if isinstance(t, Tensor)]


def _normal(args: tuple, kwargs: dict, out: Any) -> list[Read]:
    # `std.min().ge(0).item<bool>()` (CHECK_NORMAL_TENSOR_STD): in normal_impl and again in
    # the normal_out_impl it calls; the out= overload is normal_out_impl alone
    std = args[1] if len(args) > 1 else kwargs.get("std")
    if not isinstance(std, Tensor) or std.numel() == 0:
        return []
    return [("DtoH", std, 1)] * (1 if "out" in kwargs else 2)


def _segment_reduce(args: tuple, kwargs: dict, out: Any) -> list[Read]:
    # without `unsafe`, lengths are checked on the host: their minimum, then whether every
    # row sums to the data's size (offsets are not checked)
    lengths = kwargs.get("lengths")
    if not isinstance(lengths, Tensor) or kwargs.get("unsafe", False):
        return []
    return [("DtoH", lengths, lengths.element_size()), ("DtoH", lengths, 1)]


def _median(ignore_nan: bool) -> Callable[[tuple, dict, Any], list[Read]]:
    """median() / nanmedian() over all elements (the overloads with `dim` read nothing)."""
    def reads(args: tuple, kwargs: dict, out: Any) -> list[Read]:
        if len(args) > 1 or "dim" in kwargs:
            return []
        self = args[0]
        if self.numel() == 0:  # `at::full({}, NaN).to(self.options())`: sent to the device
            return [("HtoD", out, out.element_size())]
        # nanmedian: the NaNs counted on the host to find the middle element
        return [("DtoH", self, 8)] if ignore_nan else []
    return reads


def _cholesky(args: tuple, kwargs: dict, out: Any) -> list[Read]:
    return _check_errors(args, kwargs, out) if args[0].numel() else []


def _nms(args: tuple, kwargs: dict, out: Any) -> list[Read]:
    # torchvision >= 0.21 reduces the suppression mask on the device and returns the boxes
    # kept with masked_select: one count read back (older releases read the whole mask)
    return [("DtoH", args[0], 4)] if args[0].shape[0] else []


_UNIQUE = SyncRule("unique", _unique)

#: By "namespace::op" (the overload packet's name).
SYNC_RULES: dict[str, SyncRule] = {
    "aten::_local_scalar_dense": SyncRule("item", _scalar),
    "aten::nonzero": SyncRule("nonzero", _nonzero),
    "aten::masked_select": SyncRule("mask", _masked_select),
    "aten::_unique": _UNIQUE,
    "aten::_unique2": _UNIQUE,
    "aten::unique_dim": _UNIQUE,
    "aten::unique_consecutive": _UNIQUE,
    "aten::unique_dim_consecutive": _UNIQUE,
    "aten::bincount": SyncRule("bincount", _bincount),
    "aten::histc": SyncRule("histc", _histc),
    "aten::repeat_interleave": SyncRule("repeat_interleave", _repeat_interleave),
    "aten::equal": SyncRule("equal", _bool_result),
    "aten::allclose": SyncRule("allclose", _bool_result),
    "aten::masked_fill": SyncRule("masked_fill", _tensor_value(2)),
    "aten::masked_fill_": SyncRule("masked_fill", _tensor_value(2)),
    "aten::index_fill": SyncRule("index_fill", _tensor_value(3)),
    "aten::index_fill_": SyncRule("index_fill", _tensor_value(3)),
    "aten::multinomial": SyncRule("multinomial", _multinomial),
    "aten::isin": SyncRule("isin", _isin),
    "aten::_linalg_check_errors": SyncRule("linalg_check", _check_errors),
    "aten::_linalg_eigh": SyncRule("linalg_check", _check_errors),
    "aten::_linalg_svd": SyncRule("linalg_check", _svd),
    "aten::linalg_pinv": SyncRule("linalg_check", _pinv),
    "aten::linalg_eig": SyncRule("linalg_check", _check_errors),
    "aten::_ctc_loss": SyncRule("ctc_loss", _ctc_lengths),
    "aten::_nested_tensor_from_mask": SyncRule("nested_mask", _from_mask),
    "aten::_nested_tensor_from_mask_left_aligned": SyncRule("nested_mask", _left_aligned),
    "aten::linspace": SyncRule("linspace", _tensor_ends),
    "aten::logspace": SyncRule("logspace", _tensor_ends),
    "aten::normal": SyncRule("normal", _normal),
    "aten::segment_reduce": SyncRule("segment_reduce", _segment_reduce),
    "aten::median": SyncRule("median", _median(False)),
    "aten::nanmedian": SyncRule("nanmedian", _median(True)),
    "aten::linalg_lstsq": SyncRule("linalg_check", _check_errors),
    "aten::cholesky": SyncRule("linalg_check", _cholesky),
    # (its `grad.masked_select(mask)`: the mask's count)
    "aten::masked_scatter_backward": SyncRule("masked_scatter_backward", _masked_select),
    "torchvision::nms": SyncRule("nms", _nms),
}


def _prod_backward(args: tuple, kwargs: dict, out: Any) -> list[Read]:
    self = args[0]
    if not self.requires_grad or self.dim() == 0:
        return []
    if len(args) > 1 or "dim" in kwargs:  # `slice_zero_count.sum().item<int64_t>()`
        return [("DtoH", self, 8)]
    return _count(self)  # `(input == 0).nonzero()`


def _cumprod_backward(args: tuple, kwargs: dict, out: Any) -> list[Read]:
    self = args[0]
    dim = args[1] if len(args) > 1 else kwargs["dim"]
    if not self.requires_grad or self.numel() <= 1 or self.shape[dim] == 1:
        return []
    return [("DtoH", self, 1)]  # `is_zero.any().item<uint8_t>()`


def _masked_fill_backward(args: tuple, kwargs: dict, out: Any) -> list[Read]:
    value = args[2] if len(args) > 2 else kwargs.get("value")
    if not isinstance(value, Tensor) or not value.requires_grad:
        return []  # the value's gradient alone is computed with masked_select
    return _count(args[1])  # `grad.masked_select(mask).sum()`


_MASKED_FILL_BACKWARD = SyncRule("masked_fill_backward", _masked_fill_backward)

#: By "namespace::op", as SYNC_RULES: the forward ops whose backward formula reads from the
#: device on the host when PyTorch runs it outside a dispatch mode (tracer/backward.py says
#: why the tracer records it itself): the rule's `reads` of the forward call lists the
#: copies, made each time autograd runs the op's node.
BACKWARD_RULES: dict[str, SyncRule] = {
    "aten::prod": SyncRule("prod_backward", _prod_backward),
    "aten::cumprod": SyncRule("cumprod_backward", _cumprod_backward),
    "aten::masked_fill": _MASKED_FILL_BACKWARD,
    "aten::masked_fill_": _MASKED_FILL_BACKWARD,
}

#: Ops that take tensors on the host alongside device ones (beyond 0-dim scalars), by their
#: short name: the batch sizes of packed sequences, CTC lengths. (The packed sequences' host
#: outputs are unmarked by the simulated GPU's handlers: tracer/sim/torchlib.py.)
HOST_ARGUMENTS = frozenset({"_pack_padded_sequence", "_pad_packed_sequence", "_ctc_loss",
                            "_ctc_loss_backward"})

def declared_rule(name: str, direction: str, nbytes: int | Callable[..., int], arg: int,
                  trigger: str | None) -> SyncRule:
    """The rule of an op a user declares (see `optable.register_sync_op`)."""
    if "::" not in name:
        raise ValueError(f"name the op with its namespace, as 'mylib::op', not {name!r}")
    if direction not in ("DtoH", "HtoD"):
        raise ValueError(f"direction must be 'DtoH' or 'HtoD', not {direction!r}")
    size = nbytes if callable(nbytes) else (lambda args, kwargs, out: nbytes)

    def reads(args: tuple, kwargs: dict, out: Any) -> list[Read]:
        if direction == "HtoD":
            tensor = out if isinstance(out, Tensor) else out[0]
        else:
            tensor = args[arg]
        return [(direction, tensor, int(size(args, kwargs, out)))]

    return SyncRule(trigger or name.split("::", 1)[1], reads)
