"""Placement: the minimum cut against hand-worked graphs and against brute force, with and
without a device memory budget, and the budget's size parser."""

from __future__ import annotations

import random

import pytest

from memcpy_doctor.analysis.placement import (BRUTE_FORCE_MAX_FREE, Edge, Node, Placement,
                                              brute_force, place)
from memcpy_doctor.core.units import parse_bytes


def objective(nodes: list[Node], edges: list[Edge], on_device: frozenset) -> int:
    """The cost of a placement, written out again independently of the module."""
    total = sum(n.device_ns if n.key in on_device else n.host_ns for n in nodes)
    return total + sum(e.cost_ns for e in edges
                       if (e.src in on_device) != (e.dst in on_device))


def check_consistent(result: Placement, nodes: list[Node], edges: list[Edge],
                     budget: int | None = None) -> None:
    keys = {n.key for n in nodes}
    assert result.on_device | result.on_host == keys
    assert not result.on_device & result.on_host
    assert result.cost_ns == objective(nodes, edges, result.on_device)
    assert result.device_bytes == sum(n.device_bytes for n in nodes if n.key in result.on_device)
    assert result.lower_bound_ns <= result.cost_ns
    assert result.exact == (result.lower_bound_ns == result.cost_ns)
    for n in nodes:
        if n.pinned == "device":
            assert n.key in result.on_device
        elif n.pinned == "host":
            assert n.key in result.on_host
    if budget is not None:
        assert result.device_bytes <= budget


# ----- hand-worked graphs, no budget -----

def chain(copy_ns: int) -> tuple[list[Node], list[Edge]]:
    """Data loading on the host -> one op that is faster on the device -> a host-only op."""
    nodes = [Node("load", host_ns=100, device_ns=0, pinned="host"),
             Node("op", host_ns=300, device_ns=100),
             Node("print", host_ns=100, device_ns=0, pinned="host")]
    return nodes, [Edge("load", "op", copy_ns), Edge("op", "print", copy_ns)]


def test_moving_the_middle_op_to_the_host_removes_two_copies():
    nodes, edges = chain(copy_ns=500)
    result = place(nodes, edges)
    # on the device: 100 + 100 + 100 + two copies of 500 = 1300; on the host: 100 + 300 + 100
    assert result.on_host == {"load", "op", "print"}
    assert result.on_device == frozenset()
    assert result.cost_ns == 500
    assert result.exact
    assert result.method == "minimum s-t cut (Stone 1977), exact"
    check_consistent(result, nodes, edges)


def test_cheap_copies_let_the_ops_split():
    nodes, edges = chain(copy_ns=50)
    result = place(nodes, edges)
    assert result.on_device == {"op"}
    assert result.cost_ns == 100 + 100 + 100 + 50 + 50
    check_consistent(result, nodes, edges)


def test_pins_win_over_cost():
    nodes = [Node("inputs", host_ns=0, device_ns=1_000, pinned="device"),
             Node("loader", host_ns=1_000, device_ns=0, pinned="host"),
             Node("free", host_ns=10, device_ns=20)]
    edges = [Edge("inputs", "free", 100), Edge("loader", "free", 30)]
    result = place(nodes, edges)
    # free on the host: 10 + the copy from inputs (100);
    # on the device: 20 + the copy from loader (30)
    assert result.on_device == {"inputs", "free"}
    assert result.cost_ns == 1_000 + 1_000 + 20 + 30
    check_consistent(result, nodes, edges)


def test_parallel_edges_add_whichever_way_they_point():
    nodes = [Node("a", host_ns=0, device_ns=0, pinned="host"),
             Node("b", host_ns=300, device_ns=100)]
    one = [Edge("a", "b", 150)]
    assert place(nodes, one).on_device == {"b"}  # 100 + 150 < 300
    two = [Edge("a", "b", 150), Edge("b", "a", 150)]
    result = place(nodes, two)
    assert result.on_device == frozenset()  # 100 + 300 > 300
    assert result.cost_ns == 300
    check_consistent(result, nodes, two)


def test_disconnected_nodes_take_their_cheaper_side_and_ties_stay_on_the_host():
    nodes = [Node("slow_on_host", host_ns=200, device_ns=50),
             Node("slow_on_device", host_ns=50, device_ns=200),
             Node("tie", host_ns=70, device_ns=70, device_bytes=5)]
    result = place(nodes, [])
    assert result.on_device == {"slow_on_host"}
    assert result.on_host == {"slow_on_device", "tie"}
    assert result.cost_ns == 50 + 50 + 70
    assert result.device_bytes == 0


def test_a_self_edge_and_a_zero_edge_cost_nothing():
    nodes = [Node("a", host_ns=10, device_ns=0), Node("b", host_ns=0, device_ns=10)]
    edges = [Edge("a", "a", 1_000), Edge("a", "b", 0)]
    result = place(nodes, edges)
    assert result.on_device == {"a"}
    assert result.cost_ns == 0


def test_empty_graph():
    result = place([], [])
    assert result.on_device == result.on_host == frozenset()
    assert result.cost_ns == 0
    assert result.exact


def test_a_long_chain_does_not_recurse():
    n = 3_000
    nodes = [Node(i, host_ns=10, device_ns=1, pinned="host" if i == 0 else None)
             for i in range(n)]
    edges = [Edge(i, i + 1, 5) for i in range(n - 1)]
    result = place(nodes, edges)
    # one copy of 5 after the first op saves 9 on every later op
    assert result.on_device == frozenset(range(1, n))
    assert result.cost_ns == 10 + (n - 1) * 1 + 5


@pytest.mark.parametrize("make, message", [
    (lambda: Node("a", host_ns=-1, device_ns=0), "host_ns must be an int >= 0"),
    (lambda: Node("a", host_ns=1.5, device_ns=0), "host_ns must be an int >= 0"),
    (lambda: Node("a", host_ns=0, device_ns=0, device_bytes=-1), "device_bytes"),
    (lambda: Node("a", host_ns=0, device_ns=0, pinned="cuda"), "pinned must be"),
    (lambda: Edge("a", "b", -5), "cost_ns must be an int >= 0"),
    (lambda: place([Node("a", 0, 0), Node("a", 1, 1)], []), "two nodes have the key 'a'"),
    (lambda: place([Node("a", 0, 0)], [Edge("a", "b", 1)]), "no node 'b'"),
    (lambda: place([Node("a", 0, 0)], [], device_memory_bytes=-1), "budget must be an int"),
])
def test_bad_input_is_refused(make, message):
    with pytest.raises(ValueError, match=message):
        make()


# ----- against brute force -----

def random_graph(rng: random.Random, max_nodes: int = 9) -> tuple[list[Node], list[Edge]]:
    """Small graphs with round and random costs, zero costs, pins, self and parallel edges."""
    def ns() -> int:
        return rng.choice([0, 10, 50, 100, 200, rng.randrange(300)])

    nodes = [Node(i, host_ns=ns(), device_ns=ns(),
                  device_bytes=rng.choice([0, 0, rng.randrange(1, 11)]),
                  pinned=rng.choice([None] * 6 + ["host", "device"]))
             for i in range(rng.randrange(1, max_nodes + 1))]
    edges = [Edge(rng.randrange(len(nodes)), rng.randrange(len(nodes)),
                  rng.choice([0, rng.randrange(200)]))
             for _ in range(rng.randrange(2 * len(nodes) + 1))]
    return nodes, edges


def test_the_min_cut_equals_brute_force_on_random_graphs():
    rng = random.Random(1977)
    for _ in range(400):
        nodes, edges = random_graph(rng)
        result, best = place(nodes, edges), brute_force(nodes, edges)
        check_consistent(result, nodes, edges)
        assert result.exact
        assert result.cost_ns == best.cost_ns
        # of all optima, the cut puts the least memory on the device
        assert result.device_bytes == best.device_bytes


def random_budget(rng: random.Random, nodes: list[Node]) -> int:
    pinned = sum(n.device_bytes for n in nodes if n.pinned == "device")
    return rng.randint(pinned, max(pinned, sum(n.device_bytes for n in nodes)))


def test_under_a_budget_the_answer_fits_and_equals_brute_force():
    rng = random.Random(4)
    methods = set()
    for _ in range(300):
        nodes, edges = random_graph(rng)
        budget = random_budget(rng, nodes)
        result = place(nodes, edges, device_memory_bytes=budget)
        best = brute_force(nodes, edges, device_memory_bytes=budget)
        check_consistent(result, nodes, edges, budget)
        assert result.exact, result.method
        assert result.cost_ns == best.cost_ns
        methods.add(result.method.split(",")[0])
    # the random graphs reach every exact path
    assert methods == {"minimum s-t cut (Stone 1977)", "branch and bound over minimum s-t cuts "
                       "under the device memory budget",
                       "minimum s-t cut with device memory priced by a Lagrange multiplier"}


def test_without_the_exact_search_the_answer_still_fits_and_its_bound_holds():
    rng = random.Random(5)
    heuristic = 0
    for _ in range(200):
        nodes, edges = random_graph(rng)
        budget = random_budget(rng, nodes)
        result = place(nodes, edges, device_memory_bytes=budget, max_cuts=0)
        best = brute_force(nodes, edges, device_memory_bytes=budget)
        check_consistent(result, nodes, edges, budget)
        assert result.lower_bound_ns <= best.cost_ns <= result.cost_ns
        if result.exact:
            assert result.cost_ns == best.cost_ns
        else:
            assert "heuristic" in result.method
            heuristic += 1
    assert heuristic > 0


# ----- under a budget, hand-worked -----

def independent(saving_and_bytes: list[tuple[int, int]], extra_free: int = 0) -> list[Node]:
    """Unconnected ops that each take 100 ns on the host and save some of it on the device,
    plus `extra_free` free ops that need no device memory and gain nothing there."""
    return ([Node(f"op{i}", host_ns=100, device_ns=100 - saving, device_bytes=size)
             for i, (saving, size) in enumerate(saving_and_bytes)]
            + [Node(f"idle{i}", host_ns=7, device_ns=7) for i in range(extra_free)])


def test_a_budget_the_cut_already_fits_keeps_the_cut():
    nodes = independent([(60, 6), (45, 5)])
    result = place(nodes, [], device_memory_bytes=11)
    assert result.on_device == {"op0", "op1"}
    assert result.exact
    assert "already fits the device memory budget" in result.method


def test_a_budget_met_exactly_by_a_memory_price():
    nodes = independent([(100, 10), (50, 10)])
    result = place(nodes, [], device_memory_bytes=10)
    assert result.on_device == {"op0"}
    assert result.cost_ns == 0 + 100
    assert result.exact
    assert "Lagrange multiplier, exact" in result.method


# A knapsack with a duality gap: no memory price picks the two 5-byte ops together.
GAP = [(60, 6), (60, 6), (45, 5), (45, 5)]


def test_a_budget_with_a_duality_gap_is_solved_by_branch_and_bound():
    nodes = independent(GAP)
    result = place(nodes, [], device_memory_bytes=10)
    assert result.on_device == {"op2", "op3"}
    assert result.cost_ns == 400 - 90
    assert result.device_bytes == 10
    assert result.exact
    assert result.method == ("branch and bound over minimum s-t cuts under the device memory "
                             "budget, exact")
    assert result == place(nodes, [], device_memory_bytes=10, max_cuts=100)


def test_when_the_exact_search_is_cut_short_the_answer_says_it_is_a_heuristic():
    nodes = independent(GAP, extra_free=BRUTE_FORCE_MAX_FREE)
    result = place(nodes, [], device_memory_bytes=10, max_cuts=1)
    check_consistent(result, nodes, [], 10)
    assert not result.exact
    assert result.method.startswith("heuristic (")
    assert "NP-hard" in result.method and "stopped after 1 cuts" in result.method
    # the best memory price (10 ns a byte) proves the optimum costs at least 300 + 7 * 22
    assert result.lower_bound_ns == 300 + 7 * BRUTE_FORCE_MAX_FREE
    assert result.cost_ns >= 310 + 7 * BRUTE_FORCE_MAX_FREE
    with pytest.raises(ValueError, match="would try 2\\*\\*26 placements"):
        brute_force(nodes, [], device_memory_bytes=10)


def test_a_larger_graph_under_a_budget_fits():
    rng = random.Random(6)
    nodes, edges = random_graph(rng, max_nodes=1)
    for _ in range(5):
        more, more_edges = random_graph(rng, max_nodes=12)
        offset = len(nodes)
        nodes += [Node(n.key + offset, n.host_ns, n.device_ns, n.device_bytes, n.pinned)
                  for n in more]
        edges += [Edge(e.src + offset, e.dst + offset, e.cost_ns) for e in more_edges]
        edges.append(Edge(offset - 1, offset, 20))
    budget = random_budget(rng, nodes)
    result = place(nodes, edges, device_memory_bytes=budget)
    check_consistent(result, nodes, edges, budget)
    assert result.cost_ns >= place(nodes, edges).cost_ns


def test_a_budget_the_pinned_ops_exceed_is_refused():
    nodes = [Node("weights", host_ns=0, device_ns=0, device_bytes=2 * 2**30, pinned="device"),
             Node("op", host_ns=10, device_ns=1, device_bytes=1)]
    with pytest.raises(ValueError, match="pinned to the device need 2147483648 bytes of device "
                                         "memory, more than the budget of 1073741824 bytes"):
        place(nodes, [], device_memory_bytes=2**30)
    with pytest.raises(ValueError, match="pinned to the device"):
        brute_force(nodes, [], device_memory_bytes=2**30)


def test_a_zero_budget_keeps_every_op_that_needs_memory_on_the_host():
    nodes = independent([(90, 1), (90, 0)])
    result = place(nodes, [], device_memory_bytes=0)
    assert result.on_device == {"op1"}
    assert result.exact


# ----- parse_bytes -----

@pytest.mark.parametrize("text, expected", [
    ("4GiB", 4 * 2**30), ("4 GiB", 4 * 2**30), ("512MiB", 512 * 2**20), ("4GB", 4 * 10**9),
    ("1.5GiB", 3 * 2**29), ("123", 123), ("4gib", 4 * 2**30), ("4GIB", 4 * 2**30),
    ("1KB", 1000), ("1KiB", 1024), ("2TB", 2 * 10**12), ("1TiB", 2**40), ("3MB", 3 * 10**6),
    (" 7 b ", 7), ("0", 0), ("0.5KiB", 512), (".25KiB", 256), ("1.0000001KB", 1000),
])
def test_parse_bytes(text, expected):
    assert parse_bytes(text) == expected


@pytest.mark.parametrize("text", ["", "GiB", "-1GiB", "4 GiBs", "4XB", "1e9", "4 G", "nan",
                                  "4 GiB 2", "1,000"])
def test_parse_bytes_refuses(text):
    with pytest.raises(ValueError, match="as a size in bytes.*GiB"):
        parse_bytes(text)


def test_parse_bytes_wants_text():
    with pytest.raises(TypeError):
        parse_bytes(4)
