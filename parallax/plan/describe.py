"""A plan as a table, for logs and ``parallax plan`` (:meth:`Plan.describe <parallax.plan.model.Plan.describe>`).

:class:`PlanTable` is a base of :class:`~parallax.plan.model.Plan`: it reads only the plan's own fields
and queries, so this module needs nothing of :mod:`parallax.plan.model`, which builds on it (the plan's
vocabularies are :mod:`parallax.plan.vocabulary`'s).
"""

from __future__ import annotations

from parallax.plan.vocabulary import Sync

__all__ = ["PlanTable"]


class PlanTable:
    """The table of a :class:`~parallax.plan.model.Plan` (its base: ``self`` is the plan)."""

    def describe(self) -> str:
        """A table of the plan, for logs and ``parallax plan``."""
        lines = [f"run_option={self.run_option} sync={self.sync} workers={self.num_workers} "
                 f"replicas={self.num_replicas}"]
        if any(v.sync.collective for v in self.variables):
            gather = "" if self.comm.gather_backend == self.comm.backend else \
                f", all-gather backend {self.comm.gather_backend}"
            lines.append(f"  all-reduce backend {self.comm.backend}{gather}, fusion buffers up to "
                         f"{self.comm.fusion_bytes} bytes, use_allgatherv={self.comm.use_allgatherv}"
                         f"{self._describe_compression()}"
                         f"{'' if self.overlaps_backward else ', after the backward pass'}")
        elif self.comm.compression != "none" and any(v.sync is Sync.PS for v in self.variables):
            lines.append(f"  gradients pushed to the servers{self._describe_compression()}")
        for i, w in enumerate(self.workers):
            lines.append(f"  worker {i} on {w.host}: replicas on {', '.join(w.replica_devices)}; "
                         f"shared state on {w.shared_device}")
        lines.extend(self._describe_pipeline())
        if self.server_devices:
            lines.append(f"  parameter servers: local_aggregation={self.ps.local_aggregation} "
                         f"replicate_variables={self.ps.replicate_variables} "
                         f"boundary_among_servers={self.ps.boundary_among_servers} "
                         f"boundary_between_workers_and_servers={self.ps.boundary_between_workers_and_servers} "
                         f"protocol={self.ps.protocol} host_aggregation={self.ps.host_aggregation} "
                         f"release_in_step={self.ps.release_in_step} num_servers={self.ps.num_servers or 'weighed'}")
        for i, device in enumerate(self.server_devices):
            load = sum(v.num_bytes for v in self.variables if v.server == i)
            lines.append(f"  server {i}: {device}, {load} bytes of variables")
        staged = self.pipeline.stages > 1
        rows = [("variable", "shape", "dtype", "bytes", "gradient", "density", "aggregation", "sync", "where",
                 "partition of", "bytes/worker/step") + (("stage",) if staged else ())]
        for v in self.variables:
            kind = "-" if v.gradient is None else ("sparse" if v.sparse else "dense")
            shape = "[" + ",".join("?" if d is None else str(d) for d in v.shape) + "]"
            density = "unknown" if v.density is None else f"{v.density:.3g} ({v.density_source})"
            if not v.sparse:
                density = "-"
            where = f"ps:{v.server}" if v.server is not None else "every worker"
            if v.sharded and v.slot_of is not None:
                where = f"1/{self.num_workers} on each worker"
            has_grad = v.gradient is not None
            rows.append((v.name, shape, v.dtype, str(v.num_bytes), kind, density,
                         v.aggregation if has_grad else "-", v.sync if has_grad else "-", where,
                         v.partition_of or "-", str(v.bytes_per_worker)) + ((str(v.stage),) if staged else ()))
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
        for r in rows:
            lines.append("  " + "  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip())
        unknown = any(v.sparse and v.density is None and v.sync is not Sync.LOCAL for v in self.variables)
        variables, slots = self.bytes_per_rank()
        sharding = (f", slots of {sum(v.sharded and v.slot_of is None for v in self.variables)} variable(s) "
                    f"sharded 1/{self.num_workers} (zero_stage={self.zero_stage})" if self.zero_stage else "")
        lines.append(f"  memory per worker: {variables} bytes of variables, {slots} bytes of optimizer slots"
                     f"{sharding}")
        lines.append(f"  estimated bytes each worker sends per step: {self.bytes_per_worker} (see parallax/plan/cost.py"
                     + ("; an unknown density counts as 1% of the rows" if unknown else "") + ")")
        lines.extend(f"  note: {n}" for n in self.notes)
        return "\n".join(lines)

    def _describe_compression(self) -> str:
        """``, gradients sent in fp16`` (or bf16), or nothing without compression."""
        return "" if self.comm.compression == "none" else f", gradients sent in {self.comm.compression}"

    def _describe_pipeline(self) -> list[str]:
        p = self.pipeline
        if not p.active:
            return []
        lines = [f"  pipeline: {p.stages} stage(s), {p.micro_batches} micro-batch(es) per replica and step, "
                 f"cut by {p.cut_by}, schedule {p.schedule}; bubble (k-1)/(m+k-1) = {p.bubble:.2f}"]
        total = sum(p.stage_costs) or 1
        for s in range(p.stages):
            held = [v for v in self.variables if v.stage == s and v.slot_of is None]
            first = "the first op" if s == 0 else p.cuts[s - 1]
            cost = f", {100 * p.stage_costs[s] / total:.0f}% of the estimated cost" if p.stage_costs else ""
            devices = ", ".join(sorted({d for w in p.devices for r in w for d in r[s:s + 1]}))
            lines.append(f"  stage {s}: from {first}{cost}, {len(held)} variable(s) "
                         f"({sum(v.num_bytes for v in held)} bytes), on {devices}")
        return lines
