"""``parallax manifest``: what a user submits to a cluster manager, written from the job plan.

========  ==============================  ===============================================
kind      files                           how the processes start
========  ==============================  ===============================================
tfjob     ``<name>.tfjob.yaml``           Kubeflow's training operator: a pod per process,
                                          each told its task in ``TF_CONFIG`` (join mode)
mpijob    ``<name>.mpijob.yaml``          the MPI Operator: a worker pod per host, the
                                          launcher runs the command, Parallax's mpirun
polyaxon  ``polyaxonfile.yaml``           Polyaxon: a master, workers and ps tasks, each
                                          told its task in ``TF_CONFIG`` (join mode)
condor    ``parallax.sub``,               HTCondor's parallel universe: node 0 runs the
          ``parallax_condor.sh``,         command on a resource file of the job's
          ``create_environment.sh``       machines, Parallax's mpirun (ssh)
slurm     ``<name>.sbatch``               sbatch: the command on the first node, Parallax's
                                          mpirun through Slurm
========  ==============================  ===============================================

Every kind is made from the same :class:`~parallax.job.plan.JobPlan` the launcher uses, and
:func:`~parallax.manifests.common.check_views` plans the job again from what the
manager's processes will read (their ``TF_CONFIG``, host file or allocation), so a
manifest that would train another job is refused with the reason instead of written.
:mod:`parallax.manifests.validate` checks each file with the manager's own published
schema or parser.
"""

from __future__ import annotations

import json
import os
import sys

from parallax.errors import ManifestError
from parallax.job.plan import JobPlan
from parallax.manifests.batch import condor, sbatch
from parallax.manifests.common import Files, ManifestRequest, PlanFor, check_views, role_spec_of
from parallax.manifests.kubeflow import mpijob, tfjob
from parallax.manifests.polyaxon import polyaxonfile
from parallax.resources.cluster import Cluster

__all__ = ["KINDS", "ManifestRequest", "Files", "make_manifest", "write_manifest", "write_requested"]

KINDS = ("tfjob", "mpijob", "polyaxon", "condor", "slurm")


def make_manifest(job: JobPlan, cluster: Cluster, request: ManifestRequest, plan_for: PlanFor) -> Files:
    """The files of ``request.kind`` for ``job``, checked against the job their processes would plan.

    Raises:
        ManifestError: the kind cannot describe this job, or its processes would plan another one.
    """
    spec = role_spec_of(cluster)
    if request.kind == "tfjob":
        files = tfjob(job, cluster, spec, request)
    elif request.kind == "mpijob":
        files = mpijob(job, cluster, request)
    elif request.kind == "polyaxon":
        files = polyaxonfile(job, cluster, spec, request)
    elif request.kind == "condor":
        files = condor(job, cluster, request)
    elif request.kind == "slurm":
        files = sbatch(job, cluster, request)
    else:
        raise ManifestError(f"--kind {request.kind!r}: expected one of {', '.join(KINDS)}")
    check_views(job, files, plan_for, cluster.source)
    return files


def write_manifest(files: Files, directory: str) -> list[str]:
    """Write the files into ``directory`` (made if missing); their paths."""
    os.makedirs(directory, exist_ok=True)
    paths = []
    for name, text in files.files.items():
        path = os.path.join(directory, name)
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
        if name in files.executables:
            os.chmod(path, 0o755)
        paths.append(path)
    return paths


def write_requested(job: JobPlan, cluster: Cluster, request: dict, plan_for: PlanFor) -> int:
    """``parallax manifest``'s part in the script's process: make the files, write them into
    ``request["directory"]`` and record their names and notes in ``request["report"]`` (JSON); 2 with the
    reason on stderr when the kind cannot describe the job."""
    fields = {k: tuple(map(tuple, v)) if k == "env" else tuple(v) if isinstance(v, list) else v
              for k, v in request.items() if k not in ("directory", "report")}
    try:
        files = make_manifest(job, cluster, ManifestRequest(**fields), plan_for)
    except ManifestError as e:
        print(f"parallax manifest: {e}", file=sys.stderr, flush=True)
        return 2
    paths = write_manifest(files, request["directory"])
    with open(request["report"], "w", encoding="utf-8") as f:
        json.dump({"paths": paths, "files": files.files, "notes": [*files.notes, *job.choices, *job.notes],
                   "layout": job.layout, "processes": len(job.processes)}, f)
    return 0
