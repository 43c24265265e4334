"""Batch systems that give a job whole hosts (pure): a Slurm ``sbatch`` script and an HTCondor
parallel-universe submit file with its node script and environment wrapper.

Both start the command once, on the job's first host, inside an allocation of every host of
the job plan; Parallax reads the allocation there and launches every process of the plan
through ``mpirun`` (Open MPI's Slurm support under Slurm, ssh under HTCondor). Any run option
works. See docs/launching.md for what each host needs.
"""

from __future__ import annotations

import shlex

from parallax.invocation import RESOURCE_ENV
from parallax.job.plan import JobPlan
from parallax.manifests.common import Files, ManifestRequest, View, hosts_alike
from parallax.resources.cluster import Cluster
from parallax.resources.slurm import SLURM, allocation_text

__all__ = ["sbatch", "preemptible", "SLURM_SIGNAL_LEAD", "condor", "CONDOR_SUBMIT", "CONDOR_NODE", "CONDOR_ENVIRONMENT"]

CONDOR_SUBMIT = "parallax.sub"
CONDOR_NODE = "parallax_condor.sh"
CONDOR_ENVIRONMENT = "create_environment.sh"


def _exports(request: ManifestRequest, resource_info: str | None) -> list[str]:
    pairs = ([(RESOURCE_ENV, resource_info)] if resource_info else []) + list(request.environment)
    return [f"export {k}={shlex.quote(v)}" for k, v in pairs]


#: Seconds before its time limit Slurm sends the job SIGTERM (``--signal=B:TERM@...``): time for worker 0 to finish
#: its step and save.
SLURM_SIGNAL_LEAD = 120


def preemptible(command: str) -> list[str]:
    """The lines of a batch script that run ``command`` so that a SIGTERM to the script (Slurm's, before the time
    limit or at a preemption) reaches it, which saves a checkpoint and exits with 143, and that requeue the job
    then: the same command resumes from that checkpoint (docs/launching.md)."""
    return ["# Slurm's SIGTERM (before the time limit, or at a preemption) goes to the job: worker 0 saves a "
            "checkpoint at its",
            "# next step and the job exits with 143; the job is then requeued, and resumes from that checkpoint.",
            "set +e",
            f"{command} &",
            "job=$!",
            "trap 'kill -TERM \"$job\" 2>/dev/null' TERM",
            'wait "$job"; code=$?',
            'while kill -0 "$job" 2>/dev/null; do wait "$job"; code=$?; done',
            'if [ "$code" -eq 143 ]; then scontrol requeue "$SLURM_JOB_ID"; fi',
            'exit "$code"']


def sbatch(job: JobPlan, cluster: Cluster, request: ManifestRequest) -> Files:
    """An sbatch script for the hosts of ``job``: a node per host, a task per device (a GPU each on GPU hosts)."""
    shape = hosts_alike(job, cluster.source, "an sbatch job")
    hosts, gpus = shape.hosts, shape.slots if shape.gpu else 0
    head = [f"--job-name={request.name}", f"--nodes={len(hosts)}", f"--ntasks-per-node={shape.slots}",
            *([f"--gpus-per-node={gpus}"] if gpus else []), *([f"--time={request.time}"] if request.time else []),
            f"--output={request.name}-%j.out", f"--signal=B:TERM@{SLURM_SIGNAL_LEAD}", "--requeue",
            "--open-mode=append"]
    lines = ["#!/bin/bash", f"# written by parallax manifest from {cluster.source}: {len(hosts)} node(s) x "
             f"{shape.slots} {'GPU' if gpus else 'CPU replica'}(s), run option {job.layout}.",
             "# Submit: sbatch " + f"{request.name}.sbatch",
             *(f"#SBATCH {h}" for h in head), "set -euo pipefail", *request.python_env,
             *([f"cd {shlex.quote(request.workdir)}"] if request.workdir else []), *_exports(request, SLURM),
             'echo "Parallax job $SLURM_JOB_ID: nodes $SLURM_JOB_NODELIST"', *preemptible(request.shell_command)]
    environ = {"SLURM_JOB_ID": "1", "SLURM_JOB_NODELIST": ",".join(f"node{i}" for i in range(len(hosts))),
               "SLURM_TASKS_PER_NODE": f"{shape.slots}(x{len(hosts)})"}
    if gpus:
        environ["SLURM_GPUS_PER_NODE"] = str(gpus)
    view = View("the sbatch job's allocation", allocation_text(environ), gpus)
    return Files({f"{request.name}.sbatch": "\n".join(lines) + "\n"}, (view,),
                 notes=(f"sbatch {request.name}.sbatch: {len(hosts)} node(s), {shape.slots} task(s) each",))


def condor(job: JobPlan, cluster: Cluster, request: ManifestRequest) -> Files:
    """A parallel-universe submit file (a machine per host of ``job``), the script each node runs, and the
    environment wrapper that runs it (HTCondor's ``create_environment.sh`` idiom)."""
    shape = hosts_alike(job, cluster.source, "an HTCondor parallel-universe job")
    hosts, gpus, resources = shape.hosts, shape.slots if shape.gpu else 0, shape.devices
    submit = [f"# written by parallax manifest from {cluster.source}: {len(hosts)} machine(s), run option "
              f"{job.layout}", f"# Submit: condor_submit {CONDOR_SUBMIT}",
              "universe = parallel", f"executable = {CONDOR_ENVIRONMENT}",
              f"arguments = {_condor_arguments(['./' + CONDOR_NODE, '$(Cluster)', *request.command])}",
              f"machine_count = {len(hosts)}", f"request_cpus = {shape.slots}",
              *([f"request_gpus = {gpus}"] if gpus else []),
              "should_transfer_files = NO",  # every machine runs in this (shared) directory
              f"output = {request.name}.$(Cluster).$(Node).out", f"error = {request.name}.$(Cluster).$(Node).err",
              f"log = {request.name}.$(Cluster).log", "queue"]
    environment = ["#!/bin/bash", "# written by parallax manifest: prepares a node's environment, then runs its "
                   "arguments", *request.python_env,
                   *_exports(request, None), 'exec "$@"']
    node = ["#!/bin/bash", "# written by parallax manifest. Runs on every machine of the job (_CONDOR_PROCNO: this "
            "node, _CONDOR_NPROCS: how many),", "# in the submit directory, which every machine shares. Node 0 waits "
            "for every node's host name there, writes", "# the resource file and runs the command; the others hold "
            "their machine until it is done", "# (Parallax's mpirun starts their processes over ssh).",
            "set -u", "cluster=$1; shift",
            'dir=$PWD/parallax-condor.$cluster', 'mkdir -p "$dir"',
            'hostname -f > "$dir/node.$_CONDOR_PROCNO"',
            'if [ "$_CONDOR_PROCNO" != 0 ]; then', '    while [ ! -e "$dir/done" ]; do sleep 5; done', "    exit 0",
            "fi", 'until [ "$(ls "$dir" | grep -c \'^node\\.\')" -ge "$_CONDOR_NPROCS" ]; do sleep 1; done',
            'for i in $(seq 0 $((_CONDOR_NPROCS - 1))); do',
            f'    echo "$(cat "$dir/node.$i"): {resources}"',
            'done > "$dir/resource_info"',
            *([f"cd {shlex.quote(request.workdir)}"] if request.workdir else []),
            f'{RESOURCE_ENV}="$dir/resource_info" "$@"', "rc=$?", 'touch "$dir/done"', "exit $rc"]
    text = "".join(f"node{i}: {resources}\n" for i in range(len(hosts)))
    view = View("the HTCondor job's machines", text, gpus)
    return Files({CONDOR_SUBMIT: "\n".join(submit) + "\n", CONDOR_NODE: "\n".join(node) + "\n",
                  CONDOR_ENVIRONMENT: "\n".join(environment) + "\n"}, (view,),
                 notes=(f"condor_submit {CONDOR_SUBMIT}: {len(hosts)} machine(s); the job directory must be on a "
                        "file system every machine shares, with passwordless ssh between them",),
                 executables=frozenset({CONDOR_NODE, CONDOR_ENVIRONMENT}))


def _condor_arguments(argv: list[str]) -> str:
    """``arguments`` in HTCondor's new syntax: double-quoted, each argument in single quotes."""
    return '"' + " ".join("'" + a.replace("'", "''").replace('"', '""') + "'" for a in argv) + '"'
