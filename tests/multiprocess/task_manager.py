"""Start every task of a job as a cluster manager does: one process per task, each told its task in
``TF_CONFIG`` (as Kubeflow's TFJob, Polyaxon, SageMaker and Vertex do), none started by the others.

    python task_manager.py --cluster '{"chief": [...], "worker": [...], "ps": [...]}' --out DIR \\
        [--timeout S] [--prefix JSON] -- python train.py ...
    python task_manager.py --manifest job.tfjob.yaml --out DIR [--timeout S]

``--manifest`` starts (and restarts, by their ``restartPolicy``) the pods of a Kubeflow TFJob, or of a
polyaxonfile whose run is a ``tfjob``, as the training operator does: one process per replica, each with its
container's command, args, environment and working directory, and a ``TF_CONFIG`` naming every replica's address (here
``localhost`` and a free port per pod, as a pod network gives each pod its own address) and its own
task (``chief``, ``worker``, ``ps``, ``master``, ``evaluator``: the replica type in lower case).

Each task's output goes to ``DIR/<type>_<index>.log``; when all have ended (or the timeout killed
what was left), ``DIR/tasks.json`` records each task's exit code, when it ended and the exit codes it was
restarted after (``--restart_policy ExitCode``: a task that exits with 128-255 starts again, as the training
operator restarts a TFJob's pod under that policy). ``--prefix`` maps a
host to the command that runs a task there (``{"vhost2": ["nsenter", ...]}``: a virtual host).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import time


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def manifest_tasks(path: str) -> tuple[dict[str, list[str]], dict[tuple[str, int], dict], dict[str, str]]:
    """The TF_CONFIG cluster of a TFJob (or a polyaxonfile's tfjob run), each task's container, and each task
    kind's restart policy (a TFJob's ``restartPolicy``)."""
    import yaml

    with open(path) as f:
        doc = yaml.safe_load(f)
    policies = {}
    if doc.get("kind") == "TFJob":
        replicas = {kind: (spec.get("replicas", 1), spec["template"]["spec"]["containers"][0])
                    for kind, spec in doc["spec"]["tfReplicaSpecs"].items()}
        policies = {kind.lower(): spec.get("restartPolicy", "Never") for kind, spec in
                    doc["spec"]["tfReplicaSpecs"].items()}
    else:  # Polyaxon: run.kind tfjob, run.<chief|worker|ps> = {replicas, container}
        run = doc["run"]
        assert run["kind"] == "tfjob", run["kind"]
        replicas = {kind: (run[kind].get("replicas", 1), run[kind]["container"])
                    for kind in ("chief", "master", "worker", "ps", "evaluator") if kind in run}
    cluster = {kind.lower(): [f"localhost:{free_port()}" for _ in range(n)] for kind, (n, _) in replicas.items()}
    containers = {(kind.lower(), i): c for kind, (n, c) in replicas.items() for i in range(n)}
    return cluster, containers, policies


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--cluster", help="TF_CONFIG's cluster, JSON")
    p.add_argument("--manifest", help="a TFJob or polyaxonfile: start its pods")
    p.add_argument("--out", required=True)
    p.add_argument("--timeout", type=float, default=180)
    p.add_argument("--prefix", default="{}", help="JSON: host -> the command a task on it runs through")
    p.add_argument("--restart_policy", choices=["Never", "ExitCode"], default="Never",
                   help="ExitCode: start again a task that exits with 128-255 (a signal's 128 + n too), as the "
                        "training operator does")
    p.add_argument("--max_restarts", type=int, default=5, help="ExitCode: at most this many restarts per task")
    p.add_argument("--restart_delay", type=float, default=0.0,
                   help="ExitCode: seconds from a task's end to its new start (a pod's deletion and creation, "
                        "Kubernetes' back-off: 10 s the first time)")
    p.add_argument("command", nargs=argparse.REMAINDER)
    args = p.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    policies: dict[str, str] = {}
    if args.manifest:
        cluster, containers, policies = manifest_tasks(args.manifest)
    else:
        cluster, containers = json.loads(args.cluster), {}
    prefixes = json.loads(args.prefix)
    os.makedirs(args.out, exist_ok=True)
    starts: dict[str, tuple[list[str], dict, str | None, str]] = {}
    for kind, addresses in cluster.items():
        for index, address in enumerate(addresses):
            env = dict(os.environ, TF_CONFIG=json.dumps({"cluster": cluster, "task": {"type": kind, "index": index},
                                                         "environment": "cloud"}))
            container = containers.get((kind, index))
            argv, cwd = command, None
            if container is not None:
                env.update({e["name"]: e["value"] for e in container.get("env", ())})
                argv = [*container.get("command", ()), *container.get("args", ())]
                cwd = container.get("workingDir")
            prefix = prefixes.get(address.rsplit(":", 1)[0], [])
            starts[f"{kind}_{index}"] = ([*prefix, *argv], env, cwd, policies.get(kind, args.restart_policy))

    def start(name: str, mode: str = "w") -> tuple[subprocess.Popen, object]:
        argv, env, cwd, _ = starts[name]
        log = open(os.path.join(args.out, f"{name}.log"), mode)  # noqa: SIM115 - closed when it ends
        return subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=cwd,
                                start_new_session=True), log

    tasks = {name: start(name) for name in starts}
    restarts = {name: [] for name in starts}
    deadline = time.monotonic() + args.timeout
    ended: dict[str, dict] = {}
    due: dict[str, float] = {}  # the tasks to start again, and when
    while len(ended) < len(tasks) and time.monotonic() < deadline:
        for name, at in list(due.items()):
            if time.monotonic() >= at:
                del due[name]
                tasks[name] = start(name, "a")
        for name, (proc, log) in list(tasks.items()):
            if name not in ended and name not in due and proc.poll() is not None:
                log.close()
                code = proc.returncode if proc.returncode >= 0 else 128 - proc.returncode  # a container's code
                if starts[name][3] == "ExitCode" and code >= 128 and len(restarts[name]) < args.max_restarts:
                    restarts[name].append(code)
                    due[name] = time.monotonic() + args.restart_delay
                    continue
                ended[name] = {"rc": proc.returncode, "ended": time.time(), "restarts": restarts[name]}
        time.sleep(0.05)
    for name, (proc, log) in tasks.items():
        if name not in ended:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            ended[name] = {"rc": "timeout", "ended": time.time(), "restarts": restarts[name]}
            log.close()
    with open(os.path.join(args.out, "tasks.json"), "w") as f:
        json.dump(ended, f, indent=1)
    return 0 if all(e["rc"] == 0 for e in ended.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
