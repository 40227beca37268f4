"""What made a sync that PyTorch's sync-debug warning reported: the call at the warning's frame.

Light mode learns of most syncs from c10's warning alone, which names neither the call nor
the copy's direction. But the warning reaches Python while the frame that called into C++
is still on that call (PyWarningHandler hands it over as the binding returns), so the
frame's current instruction says what was called: `t.item()`, `torch.nonzero(m)`, `x[mask]`,
`if t:`. Its code position (Python 3.11's `co_positions`) gives the exact expression, read
from the source and parsed with `ast`; nothing is evaluated. A sync inside `print(t)` or an
f-string runs in torch's `_tensor_str.py`, and is named `print`.

The direction comes only from what the call cannot do otherwise: a read (`item`, `nonzero`,
`bool`, a mask index, ...) is device->host, `.cuda()` host->device; a subscript whose index
is a plain name bound to a tensor says by that tensor's device (a device mask's nonzero is
read back; a host index is sent). Anything else (`to`, `copy_`, a library's own C++ call, a
backward pass) is `unknown`, never a guess. This runs once per sync, and its reading of a
code position is cached.
"""

from __future__ import annotations

import ast
import dis
import linecache
import os
from types import FrameType
from typing import Any

import torch

from ..core.defaults import LIGHT_SYNC_TRIGGER, UNKNOWN_DIRECTION
from ..core.paths import TORCH_DIR

#: Calls that sync only by reading a device tensor back to the host (by the name the full
#: tracer gives their copy: `_ALIASES` maps the others first).
READ_CALLS = frozenset((
    "item", "tolist", "cpu", "numpy", "bool", "float", "int", "complex", "__index__",
    "nonzero", "argwhere", "nonzero_static", "unique", "unique_consecutive",
    "repeat_interleave", "bincount", "equal", "allclose", "print", "format", "mask"))
#: Calls that sync only by sending host data to the device.
SEND_CALLS = frozenset(("cuda",))
#: Calls by the name the full tracer gives their copy.
_ALIASES = {"__bool__": "bool", "__float__": "float", "__int__": "int", "is_nonzero": "bool",
            "_unique2": "unique", "masked_select": "mask"}
#: A subscript's index that is a list: built on the host and sent.
_LIST = object()

#: Opcode names by what they do with a tensor: test its truth, index it, store into it.
_TRUTH = ("POP_JUMP", "UNARY_NOT", "TO_BOOL", "JUMP_IF")
_FORMAT = ("FORMAT_VALUE", "FORMAT_SIMPLE", "FORMAT_WITH_SPEC")
_PRINTING = os.path.join(TORCH_DIR, "_tensor_str.py")


def sync_call(frame: FrameType | None) -> tuple[str, str]:
    """(trigger, direction) of the sync reported at `frame`, the innermost Python frame when
    the warning came: the call's name and "DtoH"/"HtoD", or `unknown` direction; the trigger
    is LIGHT_SYNC_TRIGGER where no call can be read there."""
    f = frame
    while f is not None and f.f_code.co_filename.startswith(TORCH_DIR):
        if f.f_code.co_filename == _PRINTING:
            return "print", "DtoH"
        f = f.f_back
    if frame is None:
        return LIGHT_SYNC_TRIGGER, UNKNOWN_DIRECTION
    trigger, index = _read(frame.f_code, frame.f_lasti)
    if trigger == "index":
        return _subscript(frame, index)
    trigger = _ALIASES.get(trigger, trigger)
    if trigger in READ_CALLS:
        return trigger, "DtoH"
    return trigger, "HtoD" if trigger in SEND_CALLS else UNKNOWN_DIRECTION


_cache: dict[tuple[Any, int], tuple[str, str | None]] = {}


def _read(code: Any, lasti: int) -> tuple[str, str | None]:
    """(trigger, the index's name for a subscript by a plain name) at instruction `lasti`."""
    key = (code, lasti)
    found = _cache.get(key)
    if found is None:
        found = _cache[key] = _decode(code, lasti)
    return found


def _decode(code: Any, lasti: int) -> tuple[str, str | None]:
    try:
        opname = dis.opname[code.co_code[lasti]]
    except IndexError:
        return LIGHT_SYNC_TRIGGER, None
    if opname.startswith(_TRUTH):
        return "bool", None
    if opname.startswith(_FORMAT):
        return "format", None
    node = _expression(code, lasti)
    if opname in ("BINARY_SUBSCR", "BINARY_SLICE", "STORE_SUBSCR") or (
            opname == "BINARY_OP" and isinstance(node, ast.Subscript)):
        index = node.slice if isinstance(node, ast.Subscript) else None
        return "index", (index.id if isinstance(index, ast.Name)
                         else _LIST if isinstance(index, ast.List) else None)
    if opname.startswith("CALL") and isinstance(node, ast.Call):
        func = node.func
        if isinstance(func, ast.Attribute):
            return func.attr, None
        if isinstance(func, ast.Name):
            return func.id, None
    return LIGHT_SYNC_TRIGGER, None


def _expression(code: Any, lasti: int) -> ast.AST | None:
    """The expression the instruction at `lasti` evaluates, parsed from the source at its
    code position; None where the source or its position is not known."""
    try:
        positions = list(code.co_positions())[lasti // 2]
    except (AttributeError, IndexError):
        return None
    line, end_line, col, end_col = positions
    if None in positions:
        return None
    lines = [linecache.getline(code.co_filename, n).encode()
             for n in range(line, end_line + 1)]
    if not all(lines):
        return None
    lines[-1] = lines[-1][:end_col]  # (columns are UTF-8 byte offsets)
    lines[0] = lines[0][col:]
    try:
        tree = ast.parse(b"(" + b"".join(lines) + b")", mode="eval")
    except (SyntaxError, ValueError):
        return None
    return tree.body


def _subscript(frame: FrameType, index: Any) -> tuple[str, str]:
    """A subscript's sync (a read, or a store into it) by its index: a name bound in the
    frame to a device tensor is a mask whose count is read back (`mask`, DtoH); to a host
    tensor, or a list, an index built on the host and sent (`index`, HtoD); anything else
    is not known."""
    if index is _LIST:
        return "index", "HtoD"
    value = None if index is None else frame.f_locals.get(index, frame.f_globals.get(index))
    if isinstance(value, torch.Tensor):
        return ("mask", "DtoH") if value.device.type != "cpu" else ("index", "HtoD")
    if isinstance(value, (list, tuple)):
        return "index", "HtoD"
    return "index", UNKNOWN_DIRECTION
