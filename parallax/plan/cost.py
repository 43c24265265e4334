"""The cost model behind ``run_option='AUTO'`` and the plan's byte estimates.

Built on :mod:`parallax.plan.traffic`: the bytes one step sends, split into
what stays inside a host and what crosses between hosts. For a variable of
``B`` bytes whose rows are ``r`` bytes each, and a sparse gradient that
touches ``k`` rows per worker and step (indices of ``i`` bytes each), among
``n`` workers on one host the totals per worker and step are:

============  =====================================  ===========================
sync          dense gradient                         sparse gradient
============  =====================================  ===========================
allreduce     ``2 (n-1)/n * B`` (ring all-reduce)    the same, made dense first
allgather     -                                      ``(n-1) * k * (r + i)``
ps            ``2 * B`` (push gradient, pull value)  ``2 * k * (r + i)`` (push
                                                     rows, read the rows)
============  =====================================  ===========================

On several hosts the collectives are hierarchical (a host's first worker
speaks for it) and a server is on one of the hosts, so part of the servers'
traffic stays inside a host (see :mod:`parallax.plan.traffic`).

:func:`choose` takes, per variable, the way that sends the fewest bytes
between hosts, then the fewest in all; ties go to all-gather, then
all-reduce (no servers needed). A dense gradient is always all-reduced.

Bytes are not all a step spends. A synchronous step with parameter servers
waits for a chain a collective does not have: every worker pushes, the chief
takes every push and applies it on the servers, then releases the others,
who read the new values at their next step (:mod:`parallax.rewrite.ps_sync`).
:func:`servers_save` weighs what the servers' choices save over the
:data:`LINKS` against :data:`SERVER_CHAIN_SECONDS`; AUTO keeps servers only
when they save more than their chain costs. Each server that holds a
variable is called by every worker's push and read, so a step with more
servers waits for more calls: :func:`servers_to_call` keeps as many of the
job's servers as save more link time than their calls cost
(:data:`SERVER_CALL_SECONDS`).
``density`` (``k / rows``) comes from the static shape of the gradient's
indices (an upper bound: repeated indices are counted, and the servers get
each row once), from a user override, or is unknown; an unknown density is
taken as small (embedding-like), which only ever chooses between all-gather
and parameter servers, whose costs grow alike with ``k``.
"""

from __future__ import annotations

from collections.abc import Sequence

from parallax.plan.model import Sync
from parallax.plan.predict import Link
from parallax.plan.traffic import UNKNOWN_DENSITY, Traffic, payload, variable_traffic

__all__ = ["bytes_per_worker", "choose", "options", "cheapest", "estimate_density", "traffic", "UNKNOWN_DENSITY",
           "LINKS", "SERVER_CHAIN_SECONDS", "SERVER_CALL_SECONDS", "link_seconds", "servers_save",
           "cheapest_without_servers", "servers_to_call"]

#: The links AUTO and ``parallax tune``'s order assume (``parallax plan --predict``'s defaults): inside a host
#: (100 Gbit/s, 5 us), between hosts (10 Gbit/s Ethernet, 20 us).
LINKS = (Link(100e9 / 8, 5e-6), Link(10e9 / 8, 20e-6))
#: What a synchronous step with parameter servers waits for that one without them does not, in seconds: the
#: chain of the push, the chief's take and apply, its release of the others and their read at the next step,
#: five gRPC calls one after another. An estimate for hosts with cores of their own (a few hundred
#: microseconds a call); on this project's 2-core machine, where servers and workers share the cores, a step
#: with servers measures 6-8 ms more than one without (docs/benchmarks.md).
SERVER_CHAIN_SECONDS = 2e-3
#: What each further server that holds variables adds to a step, in seconds: another call in every worker's push
#: and read, and another partition of its step for TensorFlow to run there, beside the first server's. An estimate,
#: a quarter of the chain; on the 2-core machine, 3 workers ran HYBRID 4.3 ms a step slower per further server on
#: one host (docs/benchmarks.md), more than half its chain.
SERVER_CALL_SECONDS = 0.5e-3


def estimate_density(shape: tuple[int | None, ...], indices_per_replica: int | None,
                     replicas_per_worker: int) -> float | None:
    """Rows touched per worker and step over all rows, at most 1; ``None`` when unknown."""
    if indices_per_replica is None or not shape or not shape[0]:
        return None
    return min(1.0, indices_per_replica * replicas_per_worker / shape[0])


def traffic(sync: Sync, shape: tuple[int | None, ...], itemsize: int, sparse: bool, density: float | None,
            hosts: Sequence[str], indices_itemsize: int = 8, host_aggregation: bool = False,
            server_host: str | None = None) -> Traffic:
    """One step's traffic for one variable among workers on ``hosts`` (a server's host unknown:
    one server per host, each as likely)."""
    return variable_traffic(payload(shape, itemsize, sparse, density, indices_itemsize), sync, hosts, server_host,
                            host_aggregation=host_aggregation)


def bytes_per_worker(sync: Sync, shape: tuple[int | None, ...], itemsize: int, sparse: bool,
                     density: float | None, num_workers: int, indices_itemsize: int = 8) -> int:
    """Estimated bytes one of ``num_workers`` workers on one host sends per step for one variable
    (the table above).

    >>> [bytes_per_worker(sync, (1000, 4), 4, True, 0.01, 3) for sync in (Sync.ALLGATHER, Sync.PS)]
    [480, 480]
    """
    if num_workers < 1:
        return 0
    t = traffic(sync, shape, itemsize, sparse, density, ["h"] * num_workers, indices_itemsize)
    return int(round(t.total / num_workers))


def options(shape: tuple[int | None, ...], itemsize: int, sparse: bool, density: float | None,
            hosts: Sequence[str] | int) -> dict[Sync, Traffic]:
    """Each way a variable could be synchronised among workers on ``hosts`` (a count: all on one
    host), in the order ties are broken, with its traffic. An unknown density compares only
    all-gather and servers (their costs grow alike with the rows)."""
    if isinstance(hosts, int):
        hosts = ["h"] * hosts
    if not sparse:
        names: tuple[Sync, ...] = (Sync.ALLREDUCE, Sync.PS)
    else:
        names = (Sync.ALLGATHER, Sync.PS) if density is None else (Sync.ALLGATHER, Sync.ALLREDUCE, Sync.PS)
    return {s: traffic(s, shape, itemsize, sparse, density, hosts) for s in names}


def cheapest(costs: dict[Sync, Traffic], sparse: bool) -> Sync:
    """The option of :func:`options` with the fewest bytes between hosts, then in all (a dense
    gradient: always all-reduce)."""
    if not sparse:
        return Sync.ALLREDUCE
    order = list(costs)
    return min(order, key=lambda s: (round(costs[s].crossing), round(costs[s].total), order.index(s)))


def choose(shape: tuple[int | None, ...], itemsize: int, sparse: bool, density: float | None,
           hosts: Sequence[str] | int) -> Sync:
    """The cheapest way to synchronise a variable among workers on ``hosts`` (a count: all on one
    host): the fewest bytes between hosts, then the fewest in all."""
    return cheapest(options(shape, itemsize, sparse, density, hosts), sparse)


def link_seconds(t: Traffic, hosts: Sequence[str], links: tuple[Link, Link] = LINKS) -> float:
    """Seconds ``t`` takes over ``links`` (inside a host, between hosts): each host's link carries its
    share of what crosses, each worker's link inside its host its share of what stays inside."""
    inside, between = links
    return t.crossing / max(1, len(set(hosts))) / between.bandwidth + t.inside / max(1, len(hosts)) / inside.bandwidth


def servers_save(costs: dict[str, dict[Sync, Traffic]], hosts: Sequence[str],
                 links: tuple[Link, Link] = LINKS) -> float:
    """Seconds per step the servers save over ``links``, for variables ``costs`` (each one's
    :func:`options`) that would go to the servers, against each one's cheapest other way.

    >>> one_host = ["h"] * 8
    >>> small = {"emb": options((10_000, 64), 4, True, 0.01, one_host)}
    >>> servers_save(small, one_host) < SERVER_CHAIN_SECONDS   # 0.1 MB of rows: not worth the chain
    True
    >>> large = {"emb": options((800_000, 512), 4, True, 0.01, one_host)}
    >>> servers_save(large, one_host) > SERVER_CHAIN_SECONDS   # 16 MB of rows per worker: worth it
    True
    """
    saved = 0.0
    for ways in costs.values():
        other = ways[cheapest_without_servers(ways)]
        saved += link_seconds(other, hosts, links) - link_seconds(ways[Sync.PS], hosts, links)
    return saved


def cheapest_without_servers(costs: dict[Sync, Traffic]) -> Sync:
    """The cheapest of a sparse gradient's :func:`options` but the servers (all-gather or all-reduce)."""
    return cheapest({s: t for s, t in costs.items() if s is not Sync.PS}, True)


def servers_to_call(t: Traffic, worker_hosts: Sequence[str], server_hosts: Sequence[str], wanted: int = 0,
                    links: tuple[Link, Link] = LINKS) -> tuple[tuple[int, ...], float, float]:
    """Which of the job's servers (on ``server_hosts``) should hold the variables whose traffic per step is
    ``t`` (:func:`traffic` of each with ``Sync.PS``, summed), for workers on ``worker_hosts``.

    Servers are taken in this order: one on each host, the hosts with the most workers first (their
    traffic stays inside), then the rest, each time by index. The first ``k`` cost a step what crosses
    between hosts over the links of the hosts they are on, plus ``k - 1`` further calls
    (:data:`SERVER_CALL_SECONDS`); the cheapest ``k`` wins, ties to the fewer (``wanted``: that many,
    at most all). Returns the chosen
    servers' indices (ascending), the seconds per step they cost, and the seconds all of them would.

    >>> hosts = ["h1", "h2", "h3"]
    >>> small = traffic(Sync.PS, (100_000, 64), 4, True, 0.003, hosts)     # 0.3 MB of rows: one server
    >>> servers_to_call(small, hosts, hosts)[0]
    (0,)
    >>> large = traffic(Sync.PS, (793_470, 512), 4, True, 0.003, hosts)    # LM1B's table: a server on each host
    >>> servers_to_call(large, hosts, hosts)[0]
    (0, 1, 2)
    """
    inside, between = links
    if not server_hosts:
        return (), 0.0, 0.0
    workers = {h: list(worker_hosts).count(h) for h in set(server_hosts)}
    first: dict[str, int] = {}
    for i, h in enumerate(server_hosts):
        first.setdefault(h, i)
    order = sorted(first.values(), key=lambda i: (-workers[server_hosts[i]], i))
    order += [i for i in range(len(server_hosts)) if i not in order]
    inside_seconds = t.inside / max(1, len(worker_hosts)) / inside.bandwidth

    def seconds(k: int) -> float:
        spread = len({server_hosts[i] for i in order[:k]})
        return t.crossing / spread / between.bandwidth + inside_seconds + (k - 1) * SERVER_CALL_SECONDS

    k = min(wanted, len(order)) if wanted else min(range(1, len(order) + 1), key=lambda n: (seconds(n), n))
    return tuple(sorted(order[:k])), seconds(k), seconds(len(order))
