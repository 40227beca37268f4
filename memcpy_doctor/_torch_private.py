"""The one import point for PyTorch's private modules, so that an upgrade touches one file."""

from torch.overrides import TorchFunctionMode  # noqa: F401  (public, kept here beside its twin)
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: F401
from torch.utils._python_dispatch import _disable_current_modes  # noqa: F401
from torch.utils.flop_counter import flop_registry  # noqa: F401
from torch._C._nn import _parse_to  # noqa: F401
