"""torch.autocast("cuda") on the simulated GPU: CUDA's cast policy, applied to device tensors.

The simulated device's tensors are host tensors, which CUDA's autocast kernels never see. While
the tracer runs, `torch.set_autocast_enabled("cuda", ...)` and `set_autocast_dtype("cuda", ...)`
(what `torch.autocast.__enter__` and `__exit__` call) also switch the host's autocast key,
and that key's kernels are replaced by CUDA's policy (PyTorch's aten/src/ATen/autocast_mode.cpp,
its `TORCH_LIBRARY_IMPL(aten, Autocast, m)` lists): matmuls and convolutions in the autocast
dtype, the ops listed as fp32 in float32, the promoting ops in their widest input type,
`binary_cross_entropy` refused. The casts sit above autograd, as CUDA's do, so backward runs
through them. Like CUDA's, they apply only to floating, non-double tensors on the (simulated)
device. The host's own CPU policy is not kept while the tracer runs: under the simulated GPU,
`torch.autocast("cpu")` follows CUDA's lists too.

Not modeled: CUDA's cache of casted weights inside an autocast region (each use casts again,
so `aten::_to_copy` is counted more often than on a GPU).
"""

from __future__ import annotations

import warnings
from contextlib import contextmanager
from typing import Any, Callable, Iterator

import torch

_LOWER = (
    "_convolution", "_convolution.deprecated", "conv1d", "conv2d", "conv3d", "conv_tbc",
    "conv_transpose1d", "conv_transpose2d.input", "conv_transpose3d.input", "convolution",
    "prelu", "addmm", "addmv", "addr", "matmul", "einsum", "mm", "mv", "linear", "addbmm",
    "baddbmm", "bmm", "chain_matmul", "linalg_multi_dot", "_thnn_fused_lstm_cell",
    "_thnn_fused_gru_cell", "lstm_cell", "gru_cell", "rnn_tanh_cell", "rnn_relu_cell",
    "scaled_dot_product_attention", "linalg_vecdot",
)
_FP32 = (
    "acos", "asin", "cosh", "erfinv", "exp", "expm1", "log", "log10", "log2", "log1p",
    "reciprocal", "rsqrt", "sinh", "tan", "pow.Tensor_Scalar", "pow.Tensor_Tensor",
    "pow.Scalar", "softplus", "layer_norm", "native_layer_norm", "group_norm",
    "frobenius_norm.dim", "nuclear_norm", "nuclear_norm.dim", "cosine_similarity",
    "poisson_nll_loss", "cosine_embedding_loss", "nll_loss", "nll_loss2d",
    "hinge_embedding_loss", "kl_div", "l1_loss", "smooth_l1_loss", "huber_loss", "mse_loss",
    "margin_ranking_loss", "multilabel_margin_loss", "soft_margin_loss", "triplet_margin_loss",
    "multi_margin_loss", "binary_cross_entropy_with_logits", "dist", "pdist", "cdist",
    "renorm", "logsumexp",
)
#: float32 unless the call names a dtype itself
_FP32_UNLESS_DTYPE = (
    "prod", "prod.dim_int", "softmax.int", "log_softmax.int", "cumprod", "cumsum",
    "linalg_vector_norm", "linalg_matrix_norm", "linalg_matrix_norm.str_ord", "sum",
    "sum.dim_IntList",
)
_PROMOTE = ("addcdiv", "addcmul", "atan2", "bilinear", "cross", "dot", "grid_sampler",
            "index_put", "tensordot", "scatter_add")
#: on the host's autocast key but not on CUDA's: left uncast
_HOST_ONLY = (
    "conv1d.padding", "conv2d.padding", "conv3d.padding", "mkldnn_rnn_layer", "avg_pool3d",
    "polar", "quantile", "quantile.scalar", "nanquantile", "nanquantile.scalar", "stft",
    "stft.center", "grid_sampler_2d", "_grid_sampler_2d_cpu_fallback", "grid_sampler_3d",
    "trace", "view_as_complex", "cholesky", "cholesky_inverse", "cholesky_solve", "inverse",
    "lu_solve", "orgqr", "ormqr", "pinverse", "max_pool3d", "max_unpool2d", "max_unpool3d",
    "adaptive_avg_pool3d", "reflection_pad1d", "reflection_pad2d", "replication_pad1d",
    "replication_pad2d", "replication_pad3d", "cross_entropy_loss", "ctc_loss.IntList",
    "ctc_loss.Tensor", "fft_fft", "fft_ifft", "fft_fft2", "fft_ifft2", "fft_fftn",
    "fft_ifftn", "fft_rfft", "fft_irfft", "fft_rfft2", "fft_irfft2", "fft_rfftn",
    "fft_irfftn", "fft_hfft", "fft_ihfft", "linalg_cond", "linalg_cond.p_str",
    "linalg_matrix_rank", "linalg_matrix_rank.tol_tensor",
    "linalg_matrix_rank.atol_rtol_tensor", "linalg_matrix_rank.atol_rtol_float",
    "linalg_solve", "linalg_cholesky", "linalg_svdvals", "linalg_eigvals",
    "linalg_eigvalsh", "linalg_inv", "linalg_householder_product", "linalg_tensorinv",
    "linalg_tensorsolve", "fake_quantize_per_tensor_affine", "geqrf", "_lu_with_info", "qr",
    "svd", "triangular_solve", "fractional_max_pool2d", "fractional_max_pool3d",
    "adaptive_max_pool3d", "multilabel_margin_loss_forward", "linalg_qr",
    "linalg_cholesky_ex", "linalg_svd", "linalg_eig", "linalg_eigh", "linalg_lstsq",
    "linalg_inv_ex", "stack", "cat", "index_copy", "index_copy.dimname",
)
_BANNED = ("binary_cross_entropy",)

_AUTOCAST_HOST = torch._C.DispatchKeySet(torch._C.DispatchKey.AutocastCPU)
_to_copy = torch.ops.aten._to_copy.default


def _op(name: str) -> Any:
    packet, _, overload = name.partition(".")
    return getattr(getattr(torch.ops.aten, packet), overload or "default")


class CudaAutocast:
    """CUDA's autocast policy on the host's autocast key, for one simulated device."""

    def __init__(self, sim: Any) -> None:
        self.on_device = sim.on_device
        self.library: Any = None

    def eligible(self, t: Any) -> bool:
        return (isinstance(t, torch.Tensor) and t.is_floating_point()
                and t.dtype is not torch.float64 and self.on_device(t))

    def cast(self, value: Any, dtype: torch.dtype) -> Any:
        if self.eligible(value) and value.dtype is not dtype:
            return _to_copy(value, dtype=dtype)
        if isinstance(value, (list, tuple)) and value and isinstance(value[0], torch.Tensor):
            return type(value)(self.cast(v, dtype) for v in value)
        return value

    def kernel(self, op: Any, policy: str) -> Callable[..., Any]:
        names = [a.name for a in op._schema.arguments]
        at = names.index("dtype") if "dtype" in names else len(names)  # its position

        def run(*args: Any, **kwargs: Any) -> Any:
            if policy == "banned":
                raise RuntimeError(
                    "torch.nn.functional.binary_cross_entropy and torch.nn.BCELoss are unsafe to "
                    "autocast.\nMany models use a sigmoid layer right before the binary cross "
                    "entropy layer.\nIn this case, combine the two layers using "
                    "torch.nn.functional.binary_cross_entropy_with_logits\nor "
                    "torch.nn.BCEWithLogitsLoss.  binary_cross_entropy_with_logits and "
                    "BCEWithLogits are\nsafe to autocast.")
            dtype = self.target(policy, args, kwargs)
            if dtype is not None:
                args = tuple(self.cast(a, dtype) for a in args)
                kwargs = {k: self.cast(v, dtype) for k, v in kwargs.items()}
            elif policy == "fp32_unless_dtype" and (args[at] if len(args) > at else kwargs.get(
                    "dtype")) is None and any(self.eligible(a) for a in args):
                if len(args) > at:
                    args = args[:at] + (torch.float32,) + args[at + 1:]
                else:
                    kwargs = {**kwargs, "dtype": torch.float32}
            with torch._C._ExcludeDispatchKeyGuard(_AUTOCAST_HOST):
                return op(*args, **kwargs)
        return run

    def target(self, policy: str, args: tuple, kwargs: dict) -> torch.dtype | None:
        """The dtype the op's device tensors are cast to, if any."""
        if policy == "lower":
            return torch.get_autocast_dtype("cuda")
        if policy == "fp32":
            return torch.float32
        if policy == "promote":
            found = [a for a in args if self.eligible(a)]
            if len(found) < 2:
                return None
            widest = found[0].dtype
            for a in found[1:]:
                widest = torch.promote_types(widest, a.dtype)
            return widest
        return None

    def install(self) -> None:
        """Replace the host autocast key's kernels by CUDA's policy (for the tracer's run)."""
        lib = torch.library.Library("aten", "IMPL")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "Overriding a previously registered kernel"
            for names, policy in ((_LOWER, "lower"), (_FP32, "fp32"), (_PROMOTE, "promote"),
                                  (_FP32_UNLESS_DTYPE, "fp32_unless_dtype"),
                                  (_BANNED, "banned")):
                for name in names:
                    try:
                        op = _op(name)
                    except AttributeError:
                        continue  # not in this torch
                    lib.impl(name, self.kernel(op, policy), "AutocastCPU")
            for name in _HOST_ONLY:
                try:
                    _op(name)
                except AttributeError:
                    continue
                lib.impl(name, torch.library.fallthrough_kernel, "AutocastCPU")
        self.library = lib

    def uninstall(self) -> None:
        if self.library is not None:
            self.library._destroy()
            self.library = None


def autocast_patches(policy: CudaAutocast) -> list[tuple[Any, str, Any]]:
    """`torch.set_autocast_enabled` / `set_autocast_dtype` for "cuda" also switch the host's
    autocast key, with CUDA's policy installed the first time it is switched on."""
    set_enabled, set_dtype = torch.set_autocast_enabled, torch.set_autocast_dtype

    def set_autocast_enabled(*args: Any) -> None:
        set_enabled(*args)
        if len(args) == 2 and str(args[0]) == "cuda":
            if args[1] and policy.library is None:
                policy.install()
            set_enabled("cpu", args[1])

    def set_autocast_dtype(device_type: str, dtype: torch.dtype) -> None:
        set_dtype(device_type, dtype)
        if str(device_type) == "cuda":
            set_dtype("cpu", dtype)

    return [(torch, "set_autocast_enabled", set_autocast_enabled),
            (torch, "set_autocast_dtype", set_autocast_dtype)]


@contextmanager
def cuda_autocast(sim: Any) -> Iterator[list[tuple[Any, str, Any]]]:
    """The patches to apply for the run; the policy's kernels are removed when it ends, and
    the host's autocast state put back as it was."""
    policy = CudaAutocast(sim)
    enabled, dtype = torch.is_autocast_enabled("cpu"), torch.get_autocast_dtype("cpu")
    try:
        yield autocast_patches(policy)
    finally:
        policy.uninstall()
        torch.set_autocast_enabled("cpu", enabled)
        torch.set_autocast_dtype("cpu", dtype)
