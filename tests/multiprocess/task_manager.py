"""Start every task of a job as a cluster manager does: one process per task, each told its task in
``TF_CONFIG`` (as Kubeflow's TFJob, Polyaxon, SageMaker and Vertex do), none started by the others.

    python task_manager.py --cluster '{"chief": [...], "worker": [...], "ps": [...]}' --out DIR \\
        [--timeout S] [--prefix JSON] -- python train.py ...

Each task's output goes to ``DIR/<type>_<index>.log``; when all have ended (or the timeout killed
what was left), ``DIR/tasks.json`` records each task's exit code and when it ended. ``--prefix`` maps a
host to the command that runs a task there (``{"vhost2": ["nsenter", ...]}``: a virtual host).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--cluster", required=True, help="TF_CONFIG's cluster, JSON")
    p.add_argument("--out", required=True)
    p.add_argument("--timeout", type=float, default=180)
    p.add_argument("--prefix", default="{}", help="JSON: host -> the command a task on it runs through")
    p.add_argument("command", nargs=argparse.REMAINDER)
    args = p.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    cluster = json.loads(args.cluster)
    prefixes = json.loads(args.prefix)
    os.makedirs(args.out, exist_ok=True)
    tasks = {}
    for kind, addresses in cluster.items():
        for index, address in enumerate(addresses):
            env = dict(os.environ, TF_CONFIG=json.dumps({"cluster": cluster, "task": {"type": kind, "index": index},
                                                         "environment": "cloud"}))
            prefix = prefixes.get(address.rsplit(":", 1)[0], [])
            log = open(os.path.join(args.out, f"{kind}_{index}.log"), "w")  # noqa: SIM115 - closed below
            proc = subprocess.Popen([*prefix, *command], stdout=log, stderr=subprocess.STDOUT, env=env,
                                    start_new_session=True)
            tasks[f"{kind}_{index}"] = (proc, log)
    deadline = time.monotonic() + args.timeout
    ended: dict[str, dict] = {}
    while len(ended) < len(tasks) and time.monotonic() < deadline:
        for name, (proc, log) in tasks.items():
            if name not in ended and proc.poll() is not None:
                ended[name] = {"rc": proc.returncode, "ended": time.time()}
                log.close()
        time.sleep(0.05)
    for name, (proc, log) in tasks.items():
        if name not in ended:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            ended[name] = {"rc": "timeout", "ended": time.time()}
            log.close()
    with open(os.path.join(args.out, "tasks.json"), "w") as f:
        json.dump(ended, f, indent=1)
    return 0 if all(e["rc"] == 0 for e in ended.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
