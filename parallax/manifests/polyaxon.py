"""A polyaxonfile (pure): a Polyaxon component whose run is a TFJob (``version: 1.1``).

Polyaxon runs it through Kubeflow's training operator: a ``chief`` (worker 0), ``worker``
replicas and ``ps`` replicas, each told its task in ``TF_CONFIG``, so every task joins
the job as in a TFJob (:mod:`parallax.manifests.kubeflow`). A role spec given as the
resources (the ``environment`` section of Polyaxon's older polyaxonfiles, see
:mod:`parallax.resources.rolespec`) gives each role its cpu, memory and gpu requests and limits.
"""

from __future__ import annotations

from dataclasses import replace

from parallax.job.plan import JobPlan
from parallax.manifests.common import Files, ManifestRequest
from parallax.manifests.kubeflow import tfjob_replicas
from parallax.resources.cluster import Cluster
from parallax.resources.rolespec import RoleSpec

__all__ = ["polyaxonfile", "POLYAXONFILE"]

POLYAXONFILE = "polyaxonfile.yaml"
_ROLES = {"Chief": "chief", "Worker": "worker", "PS": "ps"}


def polyaxonfile(job: JobPlan, cluster: Cluster, spec: RoleSpec | None, request: ManifestRequest) -> Files:
    """The polyaxonfile of ``job``: the TFJob's replicas as Polyaxon's ``run`` of kind ``tfjob``."""
    import yaml

    specs, view = tfjob_replicas(job, cluster, spec, request)  # the TFJob's replicas, the same checks
    run: dict = {"kind": "tfjob"}
    for kind, replica in specs.items():
        run[_ROLES[kind]] = {"replicas": replica["replicas"], "container": replica["template"]["spec"]["containers"][0]}
    component = {"version": 1.1, "kind": "component", "name": request.name,
                 "description": f"written by parallax manifest from {cluster.source}", "run": run}
    text = "# written by parallax manifest\n" + yaml.safe_dump(component, sort_keys=False)
    return Files({POLYAXONFILE: text}, (replace(view, what="the Polyaxon job's tasks"),),
                 notes=(f"polyaxon run -f {POLYAXONFILE}: {len(job.processes)} tasks, each running: "
                        f"{request.shell_command}",))
