"""Which ops to run on the host and which on the device: a minimum s-t cut (Stone, 1977).

With two devices, choosing a side for every op so that op time plus copy and wait time is least
is a minimum cut: ops are nodes, each op's time on the host and on the device are its edges to
the two terminals, and each tensor that would cross between devices is an edge between two ops
weighted by what the crossing costs. A maximum flow finds that cut exactly in polynomial time.

A device memory budget makes the problem NP-hard (it contains knapsack). The budget is met by,
in turn: the plain cut when it already fits; a Lagrangian price on device memory, whose lower
bound can prove its answer optimal; and a branch and bound over cuts, which is exact when it
finishes within its limit. Only when both fail to prove optimality is the answer a heuristic,
and `Placement.exact` and `Placement.method` say so.

The module knows nothing of traces: the caller builds `Node`s (for instance one per call site,
so the answer maps to lines of code) and `Edge`s, and turns the `Placement` into suggestions.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable, Iterable
from dataclasses import dataclass
from itertools import product

HOST = "host"
DEVICE = "device"

#: Minimum cuts the exact search under a memory budget may solve before settling for the best
#: answer found so far; each cut is one max-flow over the whole graph.
MAX_CUTS = 200

#: Free nodes beyond which `brute_force` refuses, rather than try 2**n placements.
BRUTE_FORCE_MAX_FREE = 22

# Device memory is priced in ns per byte as a multiple of 1/_PRICE_SCALE, so that every
# capacity stays an integer while the price can be far below one ns per byte.
_PRICE_SCALE = 1 << 20


@dataclass(frozen=True)
class Node:
    """One op, or one group of ops (a call site), to be placed on the host or the device.

    `host_ns` and `device_ns` are its modeled time on either side; `device_bytes` is the device
    memory it needs when placed there (its parameters, say); `pinned` forces a side, for ops that
    cannot move, such as data loading on the host.
    """

    key: Hashable
    host_ns: int
    device_ns: int
    device_bytes: int = 0
    pinned: str | None = None

    def __post_init__(self) -> None:
        for name in ("host_ns", "device_ns", "device_bytes"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 0:
                raise ValueError(f"node {self.key!r}: {name} must be an int >= 0, not {value!r}")
        if self.pinned not in (None, HOST, DEVICE):
            raise ValueError(f"node {self.key!r}: pinned must be None, 'host' or 'device', "
                             f"not {self.pinned!r}")


@dataclass(frozen=True)
class Edge:
    """A tensor passed from `src` to `dst`: `cost_ns` (its copy plus the host wait the copy
    causes) is paid when the two are on different sides, whichever way it crosses. Parallel
    edges add; an edge from a node to itself never crosses and costs nothing."""

    src: Hashable
    dst: Hashable
    cost_ns: int

    def __post_init__(self) -> None:
        if not isinstance(self.cost_ns, int) or self.cost_ns < 0:
            raise ValueError(f"edge {self.src!r} -> {self.dst!r}: cost_ns must be an int >= 0, "
                             f"not {self.cost_ns!r}")


@dataclass(frozen=True)
class Placement:
    """A side for every node. `cost_ns` is the objective (each node's time on its side plus every
    crossing edge); `lower_bound_ns` is a proven lower bound on the optimum, equal to `cost_ns`
    when `exact`; `method` says in a sentence how the answer was found."""

    on_device: frozenset
    on_host: frozenset
    cost_ns: int
    exact: bool
    method: str
    device_bytes: int
    lower_bound_ns: int


class _Problem:
    """The nodes by index, with parallel edges merged and self-edges dropped."""

    def __init__(self, nodes: Iterable[Node], edges: Iterable[Edge]) -> None:
        self.nodes = list(nodes)
        self.index: dict[Hashable, int] = {}
        for i, node in enumerate(self.nodes):
            if node.key in self.index:
                raise ValueError(f"two nodes have the key {node.key!r}")
            self.index[node.key] = i
        merged: dict[tuple[int, int], int] = {}
        for edge in edges:
            for end in (edge.src, edge.dst):
                if end not in self.index:
                    raise ValueError(f"edge {edge.src!r} -> {edge.dst!r}: no node {end!r}")
            i, j = sorted((self.index[edge.src], self.index[edge.dst]))
            if i != j and edge.cost_ns:
                merged[i, j] = merged.get((i, j), 0) + edge.cost_ns
        self.edges = [(i, j, c) for (i, j), c in merged.items()]
        self.neighbours: list[list[tuple[int, int]]] = [[] for _ in self.nodes]
        for i, j, c in self.edges:
            self.neighbours[i].append((j, c))
            self.neighbours[j].append((i, c))
        self.pins = [node.pinned for node in self.nodes]
        self.free = [i for i, pin in enumerate(self.pins) if pin is None]

    def cost(self, on_device: list[bool]) -> int:
        total = sum(n.device_ns if d else n.host_ns for n, d in zip(self.nodes, on_device))
        return total + sum(c for i, j, c in self.edges if on_device[i] != on_device[j])

    def device_bytes(self, on_device: list[bool]) -> int:
        return sum(n.device_bytes for n, d in zip(self.nodes, on_device) if d)

    def placement(self, on_device: list[bool], exact: bool, method: str,
                  lower_bound_ns: int | None = None) -> Placement:
        cost = self.cost(on_device)
        return Placement(
            on_device=frozenset(n.key for n, d in zip(self.nodes, on_device) if d),
            on_host=frozenset(n.key for n, d in zip(self.nodes, on_device) if not d),
            cost_ns=cost, exact=exact, method=method,
            device_bytes=self.device_bytes(on_device),
            lower_bound_ns=cost if lower_bound_ns is None else min(lower_bound_ns, cost))


class _FlowNetwork:
    """Integer capacities, arcs stored in pairs (arc e's reverse is e ^ 1), Dinic's max-flow.
    The search is iterative so that long chains of ops do not hit Python's recursion limit."""

    def __init__(self, size: int) -> None:
        self.adj: list[list[int]] = [[] for _ in range(size)]
        self.to: list[int] = []
        self.cap: list[int] = []

    def add(self, u: int, v: int, cap: int, back: int = 0) -> None:
        self.adj[u].append(len(self.to))
        self.to.append(v)
        self.cap.append(cap)
        self.adj[v].append(len(self.to))
        self.to.append(u)
        self.cap.append(back)

    def max_flow(self, s: int, t: int) -> int:
        adj, to, cap = self.adj, self.to, self.cap
        flow = 0
        while True:
            level = [-1] * len(adj)
            level[s] = 0
            queue = deque([s])
            while queue:
                u = queue.popleft()
                for e in adj[u]:
                    if cap[e] > 0 and level[to[e]] < 0:
                        level[to[e]] = level[u] + 1
                        queue.append(to[e])
            if level[t] < 0:
                return flow
            current = [0] * len(adj)
            while True:  # augmenting paths in the level graph, one at a time
                path: list[int] = []
                u = s
                while u != t:
                    arcs = adj[u]
                    while current[u] < len(arcs):
                        e = arcs[current[u]]
                        if cap[e] > 0 and level[to[e]] == level[u] + 1:
                            break
                        current[u] += 1
                    else:
                        if u == s:
                            break
                        level[u] = -1  # a dead end: never enter it again in this phase
                        u = to[path.pop() ^ 1]
                        current[u] += 1
                        continue
                    path.append(e)
                    u = to[e]
                if u != t:
                    break
                pushed = min(cap[e] for e in path)
                for e in path:
                    cap[e] -= pushed
                    cap[e ^ 1] += pushed
                flow += pushed

    def reaches(self, t: int) -> list[bool]:
        """Which vertices still reach `t` in the residual graph (after `max_flow`)."""
        seen = [False] * len(self.adj)
        seen[t] = True
        queue = deque([t])
        while queue:
            w = queue.popleft()
            for e in self.adj[w]:
                u = self.to[e]
                if not seen[u] and self.cap[e ^ 1] > 0:
                    seen[u] = True
                    queue.append(u)
        return seen


def _min_cut(p: _Problem, pins: list[str | None],
             price: list[int] | None = None) -> tuple[list[bool], int]:
    """The cheapest sides under `pins`, with `price[i]` added to node i's device cost; returns
    the sides and that (priced) cost.

    Pinned nodes are merged into their terminal, so no capacity is infinite. Of all minimum cuts
    this one puts the fewest nodes on the device (those that still reach the sink), so it also
    needs the least device memory of them: the one to test against a budget.
    """
    free = [i for i, pin in enumerate(pins) if pin is None]
    vertex = {i: v for v, i in enumerate(free)}
    source, sink = len(free), len(free) + 1
    to_device = [0] * len(free)  # arc source -> v: cut (paid) when v is on the device
    to_host = [0] * len(free)    # arc v -> sink: cut (paid) when v is on the host
    constant = 0
    for i, (node, pin) in enumerate(zip(p.nodes, pins)):
        extra = price[i] if price else 0
        if pin == HOST:
            constant += node.host_ns
        elif pin == DEVICE:
            constant += node.device_ns + extra
        else:
            to_device[vertex[i]] += node.device_ns + extra
            to_host[vertex[i]] += node.host_ns
    net = _FlowNetwork(len(free) + 2)
    for i, j, c in p.edges:
        if pins[i] is None and pins[j] is None:
            net.add(vertex[i], vertex[j], c, c)
        elif pins[i] is None or pins[j] is None:
            v, side = (vertex[i], pins[j]) if pins[i] is None else (vertex[j], pins[i])
            (to_device if side == HOST else to_host)[v] += c
        elif pins[i] != pins[j]:
            constant += c
    for v in range(len(free)):
        both = min(to_device[v], to_host[v])  # paid on either side: keep it out of the flow
        constant += both
        if to_device[v] > both:
            net.add(source, v, to_device[v] - both)
        if to_host[v] > both:
            net.add(v, sink, to_host[v] - both)
    value = constant + net.max_flow(source, sink)
    reaches = net.reaches(sink)
    on_device = [pin == DEVICE if pin else reaches[vertex[i]] for i, pin in enumerate(pins)]
    return on_device, value


def place(nodes: Iterable[Node], edges: Iterable[Edge],
          device_memory_bytes: int | None = None, max_cuts: int = MAX_CUTS) -> Placement:
    """The sides of least total cost, with at most `device_memory_bytes` of the nodes'
    `device_bytes` on the device when a budget is given.

    Without a budget the answer is one minimum cut, always exact. With one, `max_cuts` bounds
    the exact search (see the module docstring); raises ValueError when the nodes pinned to the
    device alone exceed the budget.
    """
    p = _Problem(nodes, edges)
    on_device, optimum = _min_cut(p, p.pins)
    if device_memory_bytes is None:
        return p.placement(on_device, True, "minimum s-t cut (Stone 1977), exact")
    budget = _check_budget(p, device_memory_bytes)
    if p.device_bytes(on_device) <= budget:
        return p.placement(on_device, True, "minimum s-t cut (Stone 1977), exact: it already "
                                            "fits the device memory budget")
    best, bound = _lagrangian(p, budget, optimum)
    best = _improve(p, best, budget)
    if p.cost(best) <= bound:
        return p.placement(best, True, "minimum s-t cut with device memory priced by a "
                                       "Lagrange multiplier, exact: it meets the lower bound")
    best, search_bound = _branch_and_bound(p, best, budget, max_cuts)
    bound = max(bound, search_bound)
    if bound >= p.cost(best):
        return p.placement(best, True, "branch and bound over minimum s-t cuts under the "
                                       "device memory budget, exact")
    return p.placement(best, False, (
        f"heuristic (Lagrangian price on device memory, then single-op moves): the budget "
        f"makes the exact problem NP-hard and the exact search stopped after {max_cuts} cuts; "
        f"lower_bound_ns bounds the optimum from below"), bound)


def brute_force(nodes: Iterable[Node], edges: Iterable[Edge],
                device_memory_bytes: int | None = None) -> Placement:
    """Every placement of the free nodes tried in turn: the reference `place` is tested against.
    Among equal costs, the one with the least device memory wins."""
    p = _Problem(nodes, edges)
    budget = None if device_memory_bytes is None else _check_budget(p, device_memory_bytes)
    if len(p.free) > BRUTE_FORCE_MAX_FREE:
        raise ValueError(f"brute force over {len(p.free)} free nodes would try "
                         f"2**{len(p.free)} placements")
    best: tuple[int, int] | None = None
    best_sides: list[bool] = []
    sides = [pin == DEVICE for pin in p.pins]
    for choice in product((False, True), repeat=len(p.free)):
        for i, d in zip(p.free, choice):
            sides[i] = d
        used = p.device_bytes(sides)
        if budget is not None and used > budget:
            continue
        score = (p.cost(sides), used)
        if best is None or score < best:
            best, best_sides = score, list(sides)
    return p.placement(best_sides, True, "exhaustive search over every placement, exact")


def _check_budget(p: _Problem, budget: int) -> int:
    if not isinstance(budget, int) or budget < 0:
        raise ValueError(f"the device memory budget must be an int >= 0 bytes, not {budget!r}")
    pinned = sum(n.device_bytes for n in p.nodes if n.pinned == DEVICE)
    if pinned > budget:
        raise ValueError(f"the ops pinned to the device need {pinned} bytes of device memory, "
                         f"more than the budget of {budget} bytes")
    return budget


def _lagrangian(p: _Problem, budget: int, optimum: int) -> tuple[list[bool], int]:
    """Minimum cuts with device memory priced at lambda ns per byte, lambda found by bisection:
    the best cut that fits the budget, and the best lower bound on the optimum seen.

    For every lambda >= 0 and every placement x that fits, cost(x) >= cut_lambda -
    lambda * (free budget), because x pays at most that much in price: a proven lower bound.
    The prices are rounded down so that this stays true with integer capacities.
    """
    free_budget = budget - sum(n.device_bytes for n in p.nodes if n.pinned == DEVICE)
    sizes = [n.device_bytes if pin is None else 0 for n, pin in zip(p.nodes, p.pins)]
    # at `high`, putting any free node with bytes on the device costs more than the whole graph
    total = sum(n.host_ns + n.device_ns for n in p.nodes) + sum(c for _, _, c in p.edges)
    high = (total + 1) * _PRICE_SCALE // min(b for b in sizes if b > 0) + 1
    low = 0  # the unpriced cut, already known not to fit
    best: list[bool] | None = None
    bound = optimum  # the unconstrained optimum: lambda = 0
    while high - low > 1:
        mid = (low + high) // 2
        sides, value = _min_cut(p, p.pins, [mid * b // _PRICE_SCALE for b in sizes])
        bound = max(bound, value - mid * free_budget // _PRICE_SCALE)
        if p.device_bytes(sides) <= budget:
            high = mid
            if best is None or p.cost(sides) < p.cost(best):
                best = sides
        else:
            low = mid
    if best is None:  # no price tried was high enough; `high` is
        best, _ = _min_cut(p, p.pins, [high * b // _PRICE_SCALE for b in sizes])
    return best, bound


def _improve(p: _Problem, sides: list[bool], budget: int) -> list[bool]:
    """Move single free nodes to the other side while that lowers the cost and fits."""
    sides = list(sides)
    used = p.device_bytes(sides)
    improved = True
    while improved:
        improved = False
        for i in p.free:
            node, here = p.nodes[i], sides[i]
            change = (node.host_ns - node.device_ns) if here else (node.device_ns - node.host_ns)
            for j, c in p.neighbours[i]:
                change += c if sides[j] == here else -c
            moved = used + (-node.device_bytes if here else node.device_bytes)
            if change < 0 and moved <= budget:
                sides[i], used, improved = not here, moved, True
    return sides


def _branch_and_bound(p: _Problem, best: list[bool], budget: int,
                      max_cuts: int) -> tuple[list[bool], int]:
    """Depth-first search over pins, bounded by the unconstrained minimum cut of each branch.

    A branch whose cut fits the budget is solved; one whose cut costs no less than the best
    answer so far is dropped; otherwise its heaviest free node on the device side is pinned to
    the host in one branch and to the device in the other. Returns the best answer and a lower
    bound on the optimum: the best cost when the search finished, else the least bound of the
    branches left open.
    """
    best_cost = p.cost(best)
    stack: list[tuple[int, list[str | None]]] = [(0, list(p.pins))]
    cuts = 0
    while stack:
        if cuts >= max_cuts:
            return best, min([best_cost] + [parent for parent, _ in stack])
        _, pins = stack.pop()
        sides, value = _min_cut(p, pins)
        cuts += 1
        if value >= best_cost:
            continue
        if p.device_bytes(sides) <= budget:
            best, best_cost = sides, value
            continue
        branch = max((i for i, pin in enumerate(pins) if pin is None and sides[i]),
                     key=lambda i: p.nodes[i].device_bytes)
        pinned = sum(n.device_bytes for n, pin in zip(p.nodes, pins) if pin == DEVICE)
        if pinned + p.nodes[branch].device_bytes <= budget:
            stack.append((value, pins[:branch] + [DEVICE] + pins[branch + 1:]))
        stack.append((value, pins[:branch] + [HOST] + pins[branch + 1:]))
    return best, best_cost
