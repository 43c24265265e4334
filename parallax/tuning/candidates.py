"""The layouts ``parallax tune`` tries, each planned and ordered by the plan's cost model (pure).

The space (:func:`layout_space`) is every run option the resources allow,
crossed with the choices that matter to it: for MPI and HYBRID the all-reduce
backend and fusion size; for PS and HYBRID local aggregation (and for PS
replicated variables); partition counts when the graph uses
``parallax.get_partitioner``; with ``CommunicationConfig(compression="auto")``, gradients
in their own dtype, fp16 and bf16 (never otherwise: a 16-bit format changes the
results, so only a user who allowed it gets it); ZeRO stages 1 and 2 and pipelines of 2 stages
when there are devices to share. Each choice is planned as ``parallel_run``
would plan it (:func:`parallax.job.plan.make_job_plan`); a choice the planner
refuses is kept with its reason and not tried.

The order is the predicted step's communication time
(:func:`predicted_seconds`), taking the cheapest choice of each layout (one
process, MPI, PS, HYBRID) first, then the second cheapest of each, and so on,
so that a small budget measures every kind of layout before refining one. The
prediction: the plan's bytes per step
(:func:`parallax.plan.traffic.step_traffic`, within a few percent of measured)
over the links (inside a host and between hosts), plus a latency per round of
every collective and push/pull the plan makes (a fused all-reduce buffer costs
``2 (N-1)`` rounds, so smaller fusion costs more; the sparse gradients' one all-gather
``N-1``), plus the servers' synchronous chain when any variable is on them
(:data:`parallax.plan.cost.SERVER_CHAIN_SECONDS`, as AUTO weighs it) and a call for each
further server that holds variables (:data:`~parallax.plan.cost.SERVER_CALL_SECONDS`). The compute is the same for
every data-parallel layout and is left out; ZeRO's extra gather and a
pipeline's bubble cannot be weighed without it, so those choices (which save
memory rather than time) come after the data-parallel ones of equal cost.
"""

from __future__ import annotations

import itertools
import math
from collections import Counter
from dataclasses import dataclass
from typing import Any

from parallax.analysis import GraphAnalysis
from parallax.config import Config
from parallax.errors import ParallaxError
from parallax.job.choice import describe_choice, with_choice
from parallax.plan.cost import LINKS, SERVER_CALL_SECONDS, SERVER_CHAIN_SECONDS, link_seconds
from parallax.plan.model import Sync
from parallax.plan.predict import Link
from parallax.plan.traffic import step_traffic
from parallax.resources.cluster import Cluster

__all__ = ["Candidate", "layout_space", "plan_candidates", "predicted_seconds", "DEFAULT_LINKS", "SPACE_KEYS"]

#: Inside a host, between hosts (as ``parallax plan --predict``'s defaults, and what AUTO assumes).
DEFAULT_LINKS = LINKS
#: What a user may restrict the space to (``space={"run_option": ["MPI", "PS"]}``).
SPACE_KEYS = ("run_option", "partitions", "fusion_bytes", "backend", "local_aggregation", "replicate_variables",
              "compression", "zero_stage", "pipeline_stages")


@dataclass
class Candidate:
    """One choice, its plan's facts and its predicted cost (``error``: why it cannot run)."""

    choice: dict[str, Any]
    predicted_seconds: float = math.inf
    bytes_per_step: float = 0.0
    layout: str = ""
    processes: int = 0
    memory_per_worker: int = 0
    error: str | None = None
    order: int = 0  # 1 = the cost model's first

    @property
    def runnable(self) -> bool:
        return self.error is None

    @property
    def beyond(self) -> int:
        """0: data parallelism alone; 1: with ZeRO; 2, 3: with a pipeline (and ZeRO)."""
        return bool(self.choice.get("zero_stage")) + 2 * (self.choice.get("pipeline_stages", 1) > 1)

    @property
    def kind(self) -> tuple[int, str]:
        """What a measurement of this choice tells of the others: the same layout, as far beyond dp."""
        return self.beyond, self.layout

    @property
    def label(self) -> str:
        return describe_choice(self.choice)

    def to_dict(self) -> dict[str, Any]:
        return {"choice": self.choice, "predicted_seconds": None if math.isinf(self.predicted_seconds) else
                self.predicted_seconds, "bytes_per_step": self.bytes_per_step, "layout": self.layout,
                "processes": self.processes, "memory_per_worker": self.memory_per_worker, "error": self.error,
                "order": self.order, "label": self.label}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Candidate:
        seconds = data.get("predicted_seconds")
        return cls(dict(data["choice"]), math.inf if seconds is None else seconds, data.get("bytes_per_step", 0.0),
                   data.get("layout", ""), data.get("processes", 0), data.get("memory_per_worker", 0),
                   data.get("error"), data.get("order", 0))


def _run_options(cluster: Cluster) -> list[str]:
    if cluster.servers:  # an explicit-role file names its servers: PS or HYBRID
        return ["PS", "HYBRID"]
    devices = sum(len(w.devices or ()) or 1 for w in cluster.workers)
    return ["MPI", "PS", "HYBRID"] if devices > 1 else ["MPI"]


def layout_space(cluster: Cluster, analysis: GraphAnalysis, partitions: list[int] | None = None,
                 restrict: dict[str, list] | None = None, compression: str = "none") -> list[dict[str, Any]]:
    """Every choice worth a trial for this graph on these resources (see the module docstring).

    Args:
        cluster: the resources.
        analysis: the graph's analysis.
        partitions: the partition counts to try (``None``: the graph has no partitioned variable).
        restrict: values a key may take (keys of :data:`SPACE_KEYS`), replacing the default ones.
        compression: the program's ``CommunicationConfig.compression``: only ``"auto"`` lets the space
            hold 16-bit formats.

    Raises:
        ValueError: ``restrict`` names a key that is not in :data:`SPACE_KEYS`.
    """
    restrict = dict(restrict or {})
    unknown = sorted(set(restrict) - set(SPACE_KEYS))
    if unknown:
        raise ValueError(f"tune space: unknown key(s) {', '.join(unknown)}; expected some of {', '.join(SPACE_KEYS)}")
    sparse = any(g.sparse for g in analysis.gradients)
    devices = sum(len(w.devices or ()) or 1 for w in cluster.workers)
    default: dict[str, list] = {
        "run_option": _run_options(cluster),
        "partitions": list(partitions or [None]),
        "fusion_bytes": [64 * 2**20, 4 * 2**20, 0],
        "backend": ["mpi", "collective"],
        "local_aggregation": [True, False],
        "replicate_variables": [True, False],
        "zero_stage": [0, 1, 2] if devices > 1 else [0],
        "pipeline_stages": [1, 2] if devices >= 4 and devices % 2 == 0 else [1],
        "compression": ["none", "fp16", "bf16"] if compression == "auto" else [None],
    }
    values = {k: list(restrict.get(k, default[k])) for k in SPACE_KEYS}
    out: list[dict[str, Any]] = []
    for option, parts in itertools.product(values["run_option"], values["partitions"]):
        base: dict[str, Any] = {"run_option": option}
        if parts is not None:
            base["partitions"] = parts
        combos: list[dict[str, Any]] = []
        if option in ("MPI", "HYBRID"):
            for backend, fusion in itertools.product(values["backend"], values["fusion_bytes"]):
                combos.append({"backend": backend, "fusion_bytes": fusion})
        else:
            combos.append({})
        if option in ("PS", "HYBRID") and (sparse or option == "PS"):
            replicate = values["replicate_variables"] if option == "PS" else [True]
            combos = [{**c, "local_aggregation": agg, "replicate_variables": rep}
                      for c in combos for agg, rep in itertools.product(values["local_aggregation"], replicate)]
        combos = [{**c, **({"compression": f} if f is not None else {})}
                  for c in combos for f in values["compression"]]
        for c in combos:
            out.append({**base, **c})
        if option == "MPI":  # beyond data parallelism: the mpi backend, its default fusion
            for stage in values["zero_stage"]:
                if stage:
                    out.append({**base, "backend": "mpi", "zero_stage": stage})
            for k in values["pipeline_stages"]:
                if k > 1:
                    out.append({**base, "pipeline_stages": k, "micro_batches": 2 * k})
    return out


def predicted_seconds(job, links: tuple[Link, Link] = DEFAULT_LINKS) -> float:
    """The predicted communication seconds of one step of ``job`` (module docstring)."""
    plan = job.plan
    n = max(1, len(plan.workers))
    if n < 2:
        return 0.0
    hosts = [w.host for w in plan.workers]
    seconds = link_seconds(step_traffic(plan).total, hosts, links)
    synced = [v for v in plan.variables if v.gradient is not None]
    dense = [v for v in synced if v.sync is Sync.ALLREDUCE]
    dense_bytes = sum(v.num_bytes for v in dense)
    fusion = plan.comm.fusion_bytes
    groups = (math.ceil(dense_bytes / fusion) if fusion else len(dense)) if dense else 0
    rounds = groups * 2 * (n - 1)
    rounds += n - 1 if any(v.sync is Sync.ALLGATHER for v in synced) else 0  # one call gathers them all
    servers = sum(v.sync is Sync.PS for v in synced)
    rounds += 2 * servers
    latency = links[1 if len(set(hosts)) > 1 else 0].latency
    calls = SERVER_CHAIN_SECONDS + (len(plan.server_devices) - 1) * SERVER_CALL_SECONDS if servers else 0.0
    return seconds + rounds * latency + calls


def _memory_per_worker(job) -> int:
    """Bytes of variables and optimizer slots a worker holds (ZeRO shards the slots)."""
    variables, slots = job.plan.bytes_per_rank()
    return int(variables + slots)


def plan_candidates(cluster: Cluster, analysis: GraphAnalysis, config: Config, sync: bool,
                    choices: list[dict[str, Any]], plan_job,
                    links: tuple[Link, Link] = DEFAULT_LINKS) -> list[Candidate]:
    """Plan every choice and order them, cheapest predicted first; refused ones last, with their reason.

    Args:
        plan_job: ``f(config, sync, cluster, analysis) -> (Settings, JobPlan)`` (:func:`parallax.job.plan.plan_job`).
    """
    out = []
    for choice in choices:
        candidate = Candidate(dict(choice))
        try:
            _, job = plan_job(with_choice(config, choice), sync, cluster, analysis)
        except (ParallaxError, ValueError, TypeError) as e:
            candidate.error = str(e).splitlines()[0]
            out.append(candidate)
            continue
        candidate.layout, candidate.processes = job.layout, len(job.processes)
        candidate.bytes_per_step = step_traffic(job.plan).total.total
        candidate.predicted_seconds = predicted_seconds(job, links)
        candidate.memory_per_worker = _memory_per_worker(job)
        out.append(candidate)
    cheapest = sorted((c for c in out if c.runnable), key=lambda c: (c.beyond, c.predicted_seconds, c.processes))
    # the cheapest of each kind first (in cost order), then the second of each, ...: a small budget
    # measures every kind of layout before it refines one
    seen: Counter[tuple[int, str]] = Counter()
    place = {}
    for c in cheapest:
        place[id(c)] = seen[c.kind]
        seen[c.kind] += 1
    ranked = sorted(cheapest, key=lambda c: (c.beyond, place[id(c)], c.predicted_seconds, c.processes))
    for i, c in enumerate(ranked, 1):
        c.order = i
    return ranked + [c for c in out if not c.runnable]
