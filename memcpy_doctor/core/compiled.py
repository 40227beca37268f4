"""`trace.compile`: what torch.compile did in a traced run (docs/trace-format.md).

The graphs Dynamo compiled (each a region of the trace, with its calls and the lines of its
in-graph host reads), the graph breaks it took (each at its user line, with Dynamo's reason, its
GB code, how often the program reached it and the sync copies made there) and the recompiles.
`supported` is False where the torch that ran the program could not keep compiled code
compiled under the tracer: compiled functions then ran eagerly, op by op.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from .site import Site, TraceError


@dataclass
class BreakCopy:
    """The sync copies made at a graph break's line, as the copies table has them."""

    direction: str
    trigger: str
    calls: int
    bytes: int
    time_ns: int


@dataclass
class GraphBreak:
    site: Site | None
    reason: str  # the first line of Dynamo's message
    detail: str = ""  # Dynamo's whole message
    gb_code: str | None = None  # "GB0124": the graph-break site's page
    graph_calls: int = 0  # calls of the compiled graph that ends at the break
    calls: int = 0  # times the program reached it: graph_calls, or its sync copies' calls
    sync_copies: list[BreakCopy] = field(default_factory=list)

    @property
    def sync_calls(self) -> int:
        return sum(c.calls for c in self.sync_copies)

    @property
    def sync_ns(self) -> int:
        return sum(c.time_ns for c in self.sync_copies)


#: The name of a compiled backward graph's record and row: the autograd node that runs it
BACKWARD_GRAPH = "CompiledFunctionBackward"


@dataclass
class GraphRecord:
    """One compiled graph: a Dynamo graph's region, or AOT autograd's backward graph of one
    (named BACKWARD_GRAPH, without a site or nodes of its own)."""

    name: str  # "Torch-Compiled Region: 0/1" (frame id / compile of that frame)
    site: Site | None  # its first user line
    nodes: int  # ops in Dynamo's graph
    host_reads: list[Site] = field(default_factory=list)  # in-graph .item() and such
    calls: int = 0
    #: calls whose ops were traced one by one (the rest ran untraced inside); None: all
    traced_calls: int | None = None

    @property
    def backward(self) -> bool:
        return self.name == BACKWARD_GRAPH


@dataclass
class CompileInfo:
    supported: bool
    graphs: list[GraphRecord] = field(default_factory=list)
    recompiles: int = 0
    graph_breaks: list[GraphBreak] = field(default_factory=list)
    cudagraph_skips: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def dynamo_graphs(self) -> int:
        """The graphs Dynamo compiled (the backward graphs AOT autograd made of them aside),
        as the report and diff count them."""
        return sum(not g.backward for g in self.graphs)

    def attach_copies(self, copies: list[Any]) -> None:
        """Give each graph break the sync copies made at its line, and its calls."""
        for brk in self.graph_breaks:
            if brk.site is None:
                continue
            brk.sync_copies = [
                BreakCopy(c.direction, c.trigger, c.calls, c.bytes, c.time_ns)
                for c in copies if c.sync and c.site is not None
                and (c.site.file, c.site.line) == (brk.site.file, brk.site.line)]
            brk.calls = max(brk.graph_calls, max((c.calls for c in brk.sync_copies), default=0))

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: Any) -> CompileInfo:
        """Read back `to_dict`'s output; TraceError where a field is missing or wrong."""
        if not isinstance(d, dict):
            raise TraceError("malformed trace (compile: not an object)")
        try:
            return cls._from_dict(d)
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise TraceError(f"malformed trace (compile: {type(e).__name__}: {e})") from None

    @classmethod
    def _from_dict(cls, d: dict[str, Any]) -> CompileInfo:
        return cls(
            supported=bool(d["supported"]),
            graphs=[GraphRecord(name=str(g["name"]), site=_site(g.get("site")),
                                nodes=int(g["nodes"]),
                                host_reads=[_site(s) for s in g.get("host_reads", [])],
                                calls=int(g.get("calls", 0)),
                                traced_calls=_count(g.get("traced_calls")))
                    for g in d.get("graphs", [])],
            recompiles=int(d.get("recompiles", 0)),
            graph_breaks=[GraphBreak(site=_site(b.get("site")), reason=str(b["reason"]),
                                     detail=str(b.get("detail", "")), gb_code=b.get("gb_code"),
                                     graph_calls=int(b.get("graph_calls", 0)),
                                     calls=int(b.get("calls", 0)),
                                     sync_copies=[BreakCopy(str(c["direction"]),
                                                            str(c["trigger"]), int(c["calls"]),
                                                            int(c["bytes"]), int(c["time_ns"]))
                                                  for c in b.get("sync_copies", [])])
                          for b in d.get("graph_breaks", [])],
            cudagraph_skips=[str(s) for s in d.get("cudagraph_skips", [])],
            notes=[str(n) for n in d.get("notes", [])])


def _count(n: Any) -> int | None:
    return None if n is None else int(n)


def _site(d: Any) -> Site | None:
    if d is None:
        return None
    return Site(str(d["file"]), int(d["line"]), str(d.get("function", "")))
