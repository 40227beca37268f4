"""The package's layout, read from its source with `ast`: the import rules of
docs/architecture.md, and the size limits on modules and on the tracer's functions.

Nothing is imported or run: each module's import statements are read, function-local ones
(and any under `if TYPE_CHECKING:`) included, and resolved to module names (relative imports
against the importing module's package; `from X import name` is an edge to the submodule
X.name when there is one, else to X).

An edge is the module a statement names. The packages above it, which Python imports first,
are not edges: importing `memcpy_doctor.core.trace` runs `memcpy_doctor/__init__.py`, which
imports most of the package, so counting those would put every module in a cycle with the
top-level package. That implicit import is harmless: a module needs its parent package to
exist, not to have finished, unless it takes names from it, and that is an edge. What is not
harmless, and what `test_no_import_cycles` forbids, is a module reaching back up to a package
`__init__` (`from .. import X`, `import memcpy_doctor`) that imports it: one of the two then
sees the other half-initialised. With edges counted this way
the rule is simply that the graph has no cycle at all, `__init__` modules included.

The layer rules hold for what a module reaches through any chain of imports, not only its own
statements, so a detour (analysis -> api -> tracer) is caught too; the message shows the chain.
"""

from __future__ import annotations

import ast
from functools import lru_cache
from pathlib import Path

PACKAGE = "memcpy_doctor"
ROOT = Path(__file__).resolve().parent.parent / PACKAGE

MAX_MODULE_LINES = 500
MAX_TOP_LEVEL_MODULES = 5
MAX_TRACER_FUNCTION_LINES = 80

#: What the tracer must never reach: the stages after it, what runs it, the other way traces
#: come in (kineto/), and the top-level package (whose __init__ names the API, the guards and
#: the renderers).
TRACER_MUST_NOT_REACH = (f"{PACKAGE}.analysis", f"{PACKAGE}.render", f"{PACKAGE}.guards",
                         f"{PACKAGE}.run", f"{PACKAGE}.cli", f"{PACKAGE}.api",
                         f"{PACKAGE}.pytest_plugin", f"{PACKAGE}.kineto", PACKAGE)
#: What the readers of torch.profiler traces must never reach: the same, with the tracer in
#: the kineto stage's place, since reading a trace runs nothing and imports no torch.
KINETO_MUST_NOT_REACH = (f"{PACKAGE}.analysis", f"{PACKAGE}.render", f"{PACKAGE}.guards",
                         f"{PACKAGE}.run", f"{PACKAGE}.cli", f"{PACKAGE}.api",
                         f"{PACKAGE}.pytest_plugin", f"{PACKAGE}.tracer", PACKAGE)
#: What analysis must never reach: it works on saved traces, without running anything, and
#: on every trace alike, whichever way it came in.
ANALYSIS_MUST_NOT_REACH = (f"{PACKAGE}.tracer", f"{PACKAGE}.kineto", f"{PACKAGE}.render",
                           f"{PACKAGE}.run", f"{PACKAGE}.guards", f"{PACKAGE}.cli")


def _module_name(root: Path, path: Path) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


@lru_cache(maxsize=None)
def modules(root: Path = ROOT) -> dict[str, Path]:
    """Every Python module of the package at `root`, by dotted name (a package by its own)."""
    return {_module_name(root, p): p for p in sorted(root.rglob("*.py"))}


def _compiled(root: Path, name: str) -> bool:
    """A C extension built from a source file beside the modules (tracer/_producers.c)."""
    parent, _, stem = name.rpartition(".")
    return (root.parent.joinpath(*parent.split(".")) / f"{stem}.c").is_file()


def _base(root: Path, importer: str, level: int, module: str | None) -> str:
    """The module a `from` statement names, relative imports resolved."""
    if level == 0:
        return module or ""
    is_package = modules(root)[importer].name == "__init__.py"
    parts = (importer if is_package else importer.rpartition(".")[0]).split(".")
    assert level - 1 < len(parts), f"{importer}: a relative import above the top-level package"
    parts = parts[:len(parts) - (level - 1)]
    return ".".join(parts + ([module] if module else []))


def _targets(root: Path, importer: str, node: ast.AST) -> list[str]:
    """The modules one import statement names."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if isinstance(node, ast.ImportFrom):
        base = _base(root, importer, node.level, node.module)
        found = []
        for alias in node.names:
            sub = f"{base}.{alias.name}"
            found.append(sub if sub in modules(root) or _compiled(root, sub) else base)
        return found
    return []


@lru_cache(maxsize=None)
def import_graph(root: Path = ROOT) -> dict[str, dict[str, int]]:
    """module -> {module of the same package it imports: line of the first such import}."""
    package = root.name
    graph: dict[str, dict[str, int]] = {}
    for name, path in modules(root).items():
        edges: dict[str, int] = {}
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            for target in _targets(root, name, node):
                if target != package and not target.startswith(package + "."):
                    continue
                if _compiled(root, target):
                    continue
                assert target in modules(root), (
                    f"{name} (line {node.lineno}) imports {target}, which is not a module of "
                    f"the package")
                if target != name:
                    edges.setdefault(target, node.lineno)
        graph[name] = edges
    return graph


def _under(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def _edge(graph: dict[str, dict[str, int]], a: str, b: str) -> str:
    return f"{a} -> {b} (line {graph[a][b]})"


def _chains_to(graph: dict[str, dict[str, int]], start: str,
               forbidden: tuple[str, ...]) -> list[str]:
    """Each forbidden module `start` reaches, with the chain of imports that reaches it. A
    forbidden name that is the top-level package means that module alone, not its children."""
    top = start.partition(".")[0]
    came_from: dict[str, str | None] = {start: None}
    queue = [start]
    for current in queue:
        for nxt in sorted(graph[current]):
            if nxt not in came_from:
                came_from[nxt] = current
                queue.append(nxt)
    found = []
    for target in sorted(came_from):
        if target == start or not any(target == f if f == top else _under(target, f)
                                      for f in forbidden):
            continue
        chain = [target]
        while came_from[chain[-1]] is not None:
            chain.append(came_from[chain[-1]])
        chain.reverse()
        found.append("; ".join(_edge(graph, a, b) for a, b in zip(chain, chain[1:])))
    return found


def _layer_violations(layer: str, forbidden: tuple[str, ...], root: Path = ROOT) -> list[str]:
    graph = import_graph(root)
    return [f"{name} reaches {chain}" for name in sorted(graph) if _under(name, layer)
            for chain in _chains_to(graph, name, forbidden)]


def _cycles(graph: dict[str, dict[str, int]]) -> list[str]:
    """Each set of modules that import one another in a circle (a strongly connected component
    of more than one module, by Tarjan's algorithm), with the edges inside it."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[str] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                members = sorted(component)
                edges = [_edge(graph, a, b) for a in members for b in sorted(graph[a])
                         if b in component]
                found.append(f"{', '.join(members)}: " + "; ".join(edges))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


# ----- the reader itself, on a small package written for it -----

def _write(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")


def test_the_reader_resolves_every_kind_of_import(tmp_path):
    root = tmp_path / "pkg"
    _write(root, {
        "__init__.py": "from .api import run\n",
        "api.py": "import pkg.tracer.state\nfrom pkg.core import trace\n",
        "core/__init__.py": "VERSION = 1\n",
        "core/trace.py": "import os\nfrom . import units\n",
        "core/units.py": "",
        "tracer/__init__.py": "from ..core import VERSION\nfrom .sim import marks as _m\n",
        "tracer/state.py": "def f():\n    from ..analysis.rules import R\n"
                           "from ._ext import fast\nfrom .sim.marks import mark\n",
        "tracer/_ext.c": "",
        "tracer/sim/__init__.py": "",
        "tracer/sim/marks.py": "from ...core.trace import Trace\n",
        "analysis/__init__.py": "",
        "analysis/rules.py": "from .. import api\n",
    })
    graph = import_graph(root)
    assert graph["pkg"] == {"pkg.api": 1}
    assert graph["pkg.api"] == {"pkg.tracer.state": 1, "pkg.core.trace": 2}
    assert graph["pkg.core.trace"] == {"pkg.core.units": 2}  # a submodule named in `from`
    assert graph["pkg.tracer"] == {"pkg.core": 1, "pkg.tracer.sim.marks": 2}
    # function-local, compiled (no edge), relative one and two levels up
    assert graph["pkg.tracer.state"] == {"pkg.analysis.rules": 2, "pkg.tracer.sim.marks": 4}
    assert graph["pkg.tracer.sim.marks"] == {"pkg.core.trace": 1}
    assert graph["pkg.analysis.rules"] == {"pkg.api": 1}  # `from .. import api`: the module
    # api -> tracer.state -> analysis.rules -> api
    assert _cycles(graph) == ["pkg.analysis.rules, pkg.api, pkg.tracer.state: "
                              "pkg.analysis.rules -> pkg.api (line 1); "
                              "pkg.api -> pkg.tracer.state (line 1); "
                              "pkg.tracer.state -> pkg.analysis.rules (line 2)"]
    assert _layer_violations("pkg.tracer", ("pkg.analysis", "pkg"), root) == [
        "pkg.tracer.state reaches pkg.tracer.state -> pkg.analysis.rules (line 2)"]


def test_a_child_importing_its_parent_package_back_is_a_cycle(tmp_path):
    root = tmp_path / "pkg"
    _write(root, {"__init__.py": "from .a import f\n", "a.py": "from . import VERSION\n"})
    assert _cycles(import_graph(root)) == [
        "pkg, pkg.a: pkg -> pkg.a (line 1); pkg.a -> pkg (line 1)"]


# ----- imports -----

def test_no_import_cycles():
    cycles = _cycles(import_graph())
    assert not cycles, "import cycles:\n" + "\n".join(cycles)


def test_the_tracer_never_reaches_later_stages():
    problems = _layer_violations(f"{PACKAGE}.tracer", TRACER_MUST_NOT_REACH)
    assert not problems, "tracer/ must not import analysis, render, guards, run, cli, api, " \
                         "pytest_plugin or the top-level package:\n" + "\n".join(problems)


def test_the_kineto_readers_reach_only_core():
    problems = _layer_violations(f"{PACKAGE}.kineto", KINETO_MUST_NOT_REACH)
    assert not problems, "kineto/ must import only kineto/ and core/:\n" + "\n".join(problems)


def test_core_imports_nothing_outside_core():
    core = f"{PACKAGE}.core"
    graph = import_graph()
    problems = [_edge(graph, name, target) for name, edges in sorted(graph.items())
                if _under(name, core) for target in sorted(edges) if not _under(target, core)]
    assert not problems, "core/ must import nothing from the rest of the package:\n" + \
        "\n".join(problems)


def test_analysis_never_reaches_tracer_render_run_guards_or_cli():
    problems = _layer_violations(f"{PACKAGE}.analysis", ANALYSIS_MUST_NOT_REACH)
    assert not problems, ("analysis/ must not import tracer, kineto, render, run, guards or "
                          "cli:\n") + \
        "\n".join(problems)


# ----- sizes -----

def test_few_modules_at_the_top_level():
    top = sorted(p.name for p in ROOT.glob("*.py"))
    assert len(top) <= MAX_TOP_LEVEL_MODULES, (
        f"{len(top)} modules directly in {PACKAGE}/ (at most {MAX_TOP_LEVEL_MODULES}): "
        f"{', '.join(top)}")


def test_no_module_over_the_line_limit():
    long = []
    for name, path in sorted(modules().items()):
        lines = len(path.read_text(encoding="utf-8").splitlines())
        if lines > MAX_MODULE_LINES:
            long.append(f"{path.relative_to(ROOT.parent)} ({name}): {lines} lines")
    assert not long, f"modules over {MAX_MODULE_LINES} lines:\n" + "\n".join(long)


def test_no_tracer_function_over_the_line_limit():
    """Functions and methods of tracer/, nested ones each on their own, measured from the
    `def` line to the last line of the body, docstring included."""
    long = []
    for path in sorted((ROOT / "tracer").rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        for node in sorted(ast.walk(tree), key=lambda n: getattr(n, "lineno", 0)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_TRACER_FUNCTION_LINES:
                    long.append(f"{path.relative_to(ROOT.parent)}:{node.lineno} "
                                f"{node.name}(): {lines} lines")
    assert not long, (f"tracer functions over {MAX_TRACER_FUNCTION_LINES} lines:\n"
                      + "\n".join(long))
