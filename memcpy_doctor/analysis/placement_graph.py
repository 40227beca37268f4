"""The recorded op graph as a placement problem, and its answer as device_guard suggestions.

Nodes are call sites (all ops at one line of code), so the answer maps to lines. A node's cost
on each device: on the device, its modeled or measured device time plus its launches; on the
host, the ops' host time (modeled on the simulated GPU, docs/sim-time.md; on a real GPU only
the launches were measured, so the host side is estimated from the roofline at a tenth of the
device's peak, and the answer says so), plus, for ops that ran on the device, the
device_guard that would move them (edits.guard_cost_ns). An edge is a tensor flowing
from one site to another: crossing devices costs a copy and a host wait per call. Python itself
is a node pinned to the host: values read with `.item()` or `print` flow to it, and data made
from Python lists flows from it. A node's device memory is the weights copied to the device
for it (copied once, not per step).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..core.paths import is_user_file, short_path
from ..core.trace import Site, Trace
from ..core.costmodel import profile_of
from .edits import guard_cost_ns, guard_diff
from ..core.units import format_value
from .placement import DEVICE, HOST, Edge, Node, Placement, place
from .suggestion import Suggestion

PYTHON = ("<python>", 0)
#: A CPU is taken to reach this share of the GPU's roofline when host cost was not measured.
_CPU_SHARE_OF_GPU = 0.1


def _key(site: Site) -> tuple[str, int]:
    return (site.file, site.line)


@dataclass
class Graph:
    nodes: list[Node]
    edges: list[Edge]
    observed_device: set[tuple[str, int]]
    weight_sites: dict[tuple[str, int], Site]  # where a node's weights were made
    measured_host: bool


def build_graph(trace: Trace) -> Graph:
    profile = profile_of(trace)
    measured_host = trace.meta.simulated
    host: dict[tuple, int] = {}
    device: dict[tuple, int] = {}
    observed = set()
    guarded: dict[tuple, list] = {}  # a site's device ops: what a guard there would handle
    for op in trace.ops:
        if op.site is None:
            continue
        k = _key(op.site)
        launch = op.calls * profile.launch_ns
        if op.device != "cpu":
            observed.add(k)
            device[k] = device.get(k, 0) + op.host_ns + op.device_ns
            cpu = op.run_ns if measured_host else 10 * op.device_ns
            host[k] = host.get(k, 0) + cpu
            guarded.setdefault(k, []).append(op)
        else:
            host[k] = host.get(k, 0) + op.run_ns
            per_call = (profile.kernel_ns(op.flops / op.calls, op.bytes / op.calls, "float32")
                        if op.calls else 0)
            device[k] = device.get(k, 0) + launch + per_call * op.calls
    for k, ops in guarded.items():
        host[k] += guard_cost_ns(ops)
    weights: dict[tuple, int] = {}
    weight_sites: dict[tuple, Site] = {}
    edges = []

    def copy_ns(nbytes: int) -> int:  # a sync copy: launch, transfer, host wake-up
        return profile.copy_ns("HtoD", nbytes, False) + profile.sync_ns + profile.launch_ns
    for c in trace.copies:
        per_call = c.bytes // max(c.calls, 1)
        cons = _key(c.consumer.site) if c.consumer and c.consumer.site else None
        prod = _key(c.producer.site) if c.producer and c.producer.site else None
        if c.direction == "HtoD" and c.calls == 1 and cons in device and prod is not None:
            # copied once: a weight. It takes device memory where it is used, and where it
            # is made if that runs on the device (it would be made there).
            weights[cons] = weights.get(cons, 0) + per_call
            if prod in host:
                weights[prod] = weights.get(prod, 0) + per_call
            weight_sites[cons] = c.producer.site
        if c.direction == "DtoH" and c.consumer is None and prod in host:
            edges.append(Edge(prod, PYTHON, c.calls * copy_ns(per_call)))
        if c.direction == "HtoD" and prod is None and cons in host:
            edges.append(Edge(PYTHON, cons, c.calls * copy_ns(per_call)))
    for f in trace.flows:
        if f.producer.site is None or f.consumer.site is None:
            continue
        a, b = _key(f.producer.site), _key(f.consumer.site)
        if a != b and a in host and b in host:
            edges.append(Edge(a, b, f.calls * copy_ns(f.bytes // max(f.calls, 1))))
    nodes = [Node(k, host_ns=host[k], device_ns=device[k], device_bytes=weights.get(k, 0))
             for k in host]
    nodes.append(Node(PYTHON, 0, 0, pinned=HOST))
    return Graph(nodes, edges, observed, weight_sites, measured_host)


def observed_cost(graph: Graph, to_host: frozenset = frozenset()) -> int:
    """The objective for the placement the program ran with, with the nodes `to_host` moved
    to the host."""
    side = {n.key: (DEVICE if n.key in graph.observed_device and n.key not in to_host
                    else HOST) for n in graph.nodes}
    cost = sum(n.device_ns if side[n.key] == DEVICE else n.host_ns for n in graph.nodes)
    return cost + sum(e.cost_ns for e in graph.edges if side[e.src] != side[e.dst])


def placement_suggestions(trace: Trace, device_memory_bytes: int | None = None,
                          cwd: str | None = None) -> tuple[Placement, list[Suggestion]]:
    """The best placement of the recorded ops and the device_guard edits that reach it."""
    graph = build_graph(trace)
    best = place(graph.nodes, graph.edges, device_memory_bytes)
    # (only lines of the user's own code are edited; a library's ops stay where they ran)
    to_host = sorted(k for k in graph.observed_device if k in best.on_host
                     and is_user_file(graph.weight_sites.get(k, Site(k[0], 0, "")).file))
    # the saving of the edit proposed (ops moved to the host), not of the whole optimum:
    # moves of host ops to the device are not proposed
    saving = observed_cost(graph) - observed_cost(graph, frozenset(to_host))
    suggestions = []
    if to_host and (saving > 0 or device_memory_bytes is not None):
        sites = []
        for k in to_host:
            # a node holding weights is guarded where the weights are made (the module's
            # construction), so they stay on the host; others where they run
            site = graph.weight_sites.get(k)
            sites.append(_key(site) if site is not None else k)
        sites = sorted(set(sites))
        removed = [c for c in trace.copies
                   if c.consumer and c.consumer.site and _key(c.consumer.site) in to_host]
        diffs = [guard_diff(f, [ln for ff, ln in sites if ff == f], "cpu", cwd)
                 for f in sorted({f for f, _ in sites})]
        where = ", ".join(f"{short_path(f, cwd)}:{ln}" for f, ln in sites)
        moved = [o for o in trace.ops if o.device != "cpu" and o.site is not None
                 and _key(o.site) in to_host]
        budget = ("" if device_memory_bytes is None
                  else f" within {format_value('bytes', device_memory_bytes)} of device memory")
        peak = trace.summary.peak_device_memory_bytes
        required = (device_memory_bytes is not None and peak is not None
                    and peak > device_memory_bytes)
        freed = sum(n.device_bytes for n in graph.nodes
                    if n.key in graph.observed_device and n.key in best.on_host)
        reaches = ("" if peak is None else
                   f"; the device memory peak goes from {format_value('bytes', peak)} to at "
                   f"most {format_value('bytes', max(peak - freed, 0))} (less the "
                   f"{format_value('bytes', freed)} of weights it keeps on the host; their "
                   "gradients and optimizer state leave the device too)")
        suggestions.append(Suggestion(
            rule="placement",
            title=(f"required to fit{budget}: place the ops at {where} on the host"
                   if required else f"place the ops at {where} on the host{budget}"),
            detail=(f"{best.method}; modeled cost {observed_cost(graph) / 1e6:.4g} ms as run, "
                    f"{(observed_cost(graph) - saving) / 1e6:.4g} ms with this edit, "
                    f"{best.cost_ns / 1e6:.4g} ms at the optimum"
                    + ("" if graph.measured_host else
                       "; host cost estimated (not measured on a real GPU)") + reaches
                    + ("; without it the run does not fit the device at all, so it is "
                       "listed whatever it costs" if required else "")),
            sites=[Site(f, ln, "") for f, ln in sites], removes=removed,
            saving_ns=saving,
            diff="".join(d for d in diffs if d) or None,
            apply={"kind": "device_guard", "device": "cpu",
                   "sites": [{"file": f, "line": ln} for f, ln in sites]},
            exact=best.exact and graph.measured_host,
            moved=moved, cost_ns=guard_cost_ns(moved), required=required))
    return best, suggestions
