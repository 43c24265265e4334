"""A job without TensorFlow, started by :func:`parallax.launch.launcher.launch`: each rank
meets the others at a barrier and writes ``rank_<r>.json`` (what launching alone costs), with the
``CUDA_VISIBLE_DEVICES`` it was started with, the cores it may run on and the cores the launcher told it it is
bound to."""

from __future__ import annotations

import argparse
import json
import os
import sys


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--resource_info")
    parser.add_argument("--out", required=True)
    parser.add_argument("--rank", action="store_true")
    parser.add_argument("--gpus", type=int, default=0, help="the GPUs a bare host line stands for (faked)")
    args = parser.parse_args()
    if args.rank:
        from mpi4py import MPI

        from parallax.invocation import Invocation

        comm = MPI.COMM_WORLD
        comm.Barrier()
        with open(os.path.join(args.out, f"rank_{comm.rank}.json"), "w") as f:
            json.dump({"rank": comm.rank, "size": comm.size, "pid": os.getpid(),
                       "gpus": os.environ.get("CUDA_VISIBLE_DEVICES"), "cores": sorted(os.sched_getaffinity(0)),
                       "bound": Invocation.from_env(dict(os.environ)).launch.bound_cores}, f)
        return
    from parallax.launch.launcher import launch
    from parallax.launch.layout import ranks_per_device
    from parallax.resources.files import parse_resource_file

    os.makedirs(args.out, exist_ok=True)
    result = launch(ranks_per_device(parse_resource_file(args.resource_info).with_bare_hosts(args.gpus)),
                    [os.path.abspath(__file__), "--rank", "--out", args.out])
    sys.exit(result.returncode)


if __name__ == "__main__":
    main()
