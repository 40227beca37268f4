"""The IPython / Jupyter extension: `%load_ext memcpy_doctor`, then

    %%memcpy_doctor [--device sim] [--light] [-o trace.json] [--sort total]
    <the cell's code>

profiles the cell, and `%memcpy_doctor [OPTIONS] STATEMENT` one line. The code runs as the
cell would without the magic, as `%%time` runs it: in the notebook's namespace, its output its
own, its last expression's value the cell's, its exception the cell's (the cell fails, Run All
stops there); the tracer is stopped however it ends, and the trace displayed: once the
extension is loaded, a `Trace` shows itself as the HTML report in a notebook and as the text
report in a terminal (IPython display formatters, registered by type name, so that
core/trace.py stays a data model that renders nothing). The last trace is kept as
`_memcpy_doctor_trace` in the namespace (`trace.save(...)` for `memcpy-doctor explain`).

Nothing here is imported until `%load_ext memcpy_doctor` asks for it (and it imports IPython,
which the package does not depend on).
"""

from __future__ import annotations

import ast
import re
from typing import Any

from IPython.core.error import UsageError
from IPython.core.magic import Magics, cell_magic, line_magic, magics_class
from IPython.display import display

from ..core.defaults import DEFAULT_DEVICE, DEFAULT_SORT_KEY, DEVICE_CHOICES, SORT_KEYS

#: The name the last profiled trace is kept under in the user's namespace.
TRACE_NAME = "_memcpy_doctor_trace"
_USAGE = ("usage: %%memcpy_doctor [--device auto|cuda|sim] [--light] [-o PATH] "
          "[--sort calls|total|max|min|ave]")


#: One word of the options: a quoted string or a run of non-blanks, after blanks.
_WORD = re.compile(r"""\s*("[^"]*"|'[^']*'|\S+)""")


def parse_options(line: str) -> tuple[dict[str, Any], str]:
    """The magic's options from the start of `line`, and the rest as typed (a line magic's
    statement). IPython's UsageError (shown as one line, nothing run) for an unknown option
    or a bad value."""
    opts: dict[str, Any] = {"device": DEFAULT_DEVICE, "light": False, "output": None,
                            "sort": DEFAULT_SORT_KEY}
    at = 0
    while True:
        m = _WORD.match(line, at)
        if m is None or not m.group(1).startswith("-"):
            break
        word, at = m.group(1), m.end()
        if word == "--light":
            opts["light"] = True
            continue
        value = _WORD.match(line, at) if word in ("--device", "-o", "--output", "--sort") \
            else None
        if value is None:
            raise UsageError(f"memcpy_doctor: unknown option {word!r} (or no value); {_USAGE}")
        opts[{"-o": "output", "--output": "output"}.get(word, word[2:])] = \
            value.group(1).strip("'\"")
        at = value.end()
    if opts["device"] not in DEVICE_CHOICES:
        raise UsageError(f"memcpy_doctor: --device {opts['device']!r}: one of "
                         f"{', '.join(DEVICE_CHOICES)}")
    if opts["sort"] not in SORT_KEYS:
        raise UsageError(f"memcpy_doctor: --sort {opts['sort']!r}: one of "
                         f"{', '.join(SORT_KEYS)}")
    return opts, line[at:].strip()


@magics_class
class MemcpyDoctorMagics(Magics):
    """`%memcpy_doctor` and `%%memcpy_doctor` (see the module docstring)."""

    @line_magic("memcpy_doctor")
    def profile_line(self, line: str) -> Any:
        opts, statement = parse_options(line)
        if not statement.strip():
            raise UsageError(f"memcpy_doctor: no statement to profile; {_USAGE} STATEMENT")
        return self._profile(statement, opts)

    @cell_magic("memcpy_doctor")
    def profile_cell(self, line: str, cell: str) -> Any:
        opts, extra = parse_options(line)
        if extra.strip():
            raise UsageError(f"memcpy_doctor: {extra!r}: only options go on the "
                             "%%memcpy_doctor line")
        return self._profile(cell, opts)

    def _profile(self, code: str, opts: dict[str, Any]) -> Any:
        """Run `code` in the notebook's namespace under a tracer, as `%%time` runs a cell:
        its last expression's value is the magic's (IPython shows it as the cell's `Out`),
        and its exception propagates, so the cell fails as it would without the magic (Run
        All stops there); the trace is displayed first, however the code ended."""
        shell = self.shell
        source = shell.transform_cell(code)  # (%magics and !commands inside the cell)
        tree = shell.compile.ast_parse(source)
        last = tree.body.pop() if tree.body and isinstance(tree.body[-1], ast.Expr) else None
        name = shell.compile.cache(source)  # (so that tracebacks and sites show its lines)
        body = shell.compile(tree, name, "exec")
        value = shell.compile(ast.Expression(last.value), name, "eval") if last else None
        try:
            tracer = _tracer(opts)
            tracer.start()
        except (ValueError, RuntimeError) as e:  # no GPU for --device cuda; a tracer running
            raise UsageError(f"memcpy_doctor: {e}") from None
        try:
            exec(body, shell.user_ns)
            return eval(value, shell.user_ns) if value is not None else None
        finally:
            trace = tracer.stop()
            shell.user_ns[TRACE_NAME] = trace
            if opts["output"]:
                trace.save(opts["output"])
            display(trace)


def _tracer(opts: dict[str, Any]) -> Any:
    if opts["light"]:
        from ..tracer.light import LightTracer
        return LightTracer(device=opts["device"], command=["%memcpy_doctor"])
    from ..tracer import Tracer
    return Tracer(device=opts["device"], command=["%memcpy_doctor"])


def load_ipython_extension(ipython: Any) -> None:
    """`%load_ext memcpy_doctor`: register the magics, and how a Trace displays."""
    ipython.register_magics(MemcpyDoctorMagics)
    formatters = ipython.display_formatter.formatters
    formatters["text/html"].for_type_by_name("memcpy_doctor.core.trace", "Trace", _html)
    formatters["text/plain"].for_type_by_name("memcpy_doctor.core.trace", "Trace", _pretty)


def _html(trace: Any) -> str:
    from ..render.notebook import trace_html
    return trace_html(trace)


def _pretty(trace: Any, printer: Any, cycle: bool) -> None:
    from ..render.text import render_text
    printer.text(render_text(trace))
