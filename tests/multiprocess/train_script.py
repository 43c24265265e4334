"""A training script run as a user would (``python train_script.py ...``); used by the
multi-process tests. Each rank writes its final variables to ``<out>/rank_<id>.npz``."""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import parallax  # noqa: E402
from tests.idioms import IDIOM_DATA, IDIOMS, PAUSE  # noqa: E402
from tests.models import BUILDERS, DATA, count_applied_gradients  # noqa: E402

BUILDERS = {**BUILDERS, **IDIOMS}
DATA = {**DATA, **IDIOM_DATA}


def is_slot(variable, graph) -> bool:
    """Whether ``variable`` is an optimizer slot (as Parallax's analysis finds them)."""
    from parallax.analysis import analyse_graph

    return variable.op.name in {v.name for v in analyse_graph(graph).variables if v.slot_of}


def note_time(out: str, what: str) -> None:
    """Write the time to ``<out>/<what>`` (``killed_at``, ``raised_at``) for the test to measure from."""
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, what), "w") as f:
        f.write(repr(time.time()))


def kill(pid: int, out: str) -> None:
    """SIGKILL ``pid``, first writing the time to ``<out>/killed_at``."""
    note_time(out, "killed_at")
    os.kill(pid, signal.SIGKILL)


class StepCounter(tf.compat.v1.train.SessionRunHook):
    """A user hook: counts this worker's steps into <out>/hook_<pid>.txt at the end."""

    def __init__(self, out: str) -> None:
        self.out, self.runs, self.threads = out, 0, None

    def after_create_session(self, session, coord):
        config = getattr(session, "_config", None)  # the ConfigProto the tf.compat.v1.Session was made with
        self.threads = config.intra_op_parallelism_threads if config is not None else None

    def after_run(self, run_context, run_values):
        self.runs += 1

    def end(self, session):
        os.makedirs(self.out, exist_ok=True)
        with open(os.path.join(self.out, f"hook_{os.getpid()}.txt"), "w") as f:
            f.write(f"{self.runs} {self.threads}")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser()
    p.add_argument("--resource_info", required=True)
    p.add_argument("--model", default="mlp")
    p.add_argument("--optimizer", default="adam")
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--batch", type=int, default=12)
    p.add_argument("--run_option", default="MPI", help="'default': Config's own default (None)")
    # `make test-horovod` sets PARALLAX_TEST_BACKEND=horovod: every job of the tests then all-reduces with it
    p.add_argument("--backend", default=os.environ.get("PARALLAX_TEST_BACKEND") or "auto")
    p.add_argument("--average_sparse", action="store_true")
    p.add_argument("--use_allgatherv", action="store_true")
    p.add_argument("--fusion_bytes", type=int, default=64 * 1024 * 1024)
    p.add_argument("--no_overlap", action="store_true", help="MPIConfig(overlap=False)")
    p.add_argument("--compression", default=None, help="CommunicationConfig.compression")
    p.add_argument("--redirect_path", default=None)
    p.add_argument("--kill_rank", type=int, default=-1)
    p.add_argument("--kill_step", type=int, default=2)
    p.add_argument("--raise_rank", type=int, default=-1)
    p.add_argument("--sleep_rank", type=int, default=-1, help="this worker sleeps --sleep_seconds at --kill_step")
    p.add_argument("--sleep_seconds", type=float, default=0.0)
    p.add_argument("--stall_timeout", type=float, default=30.0)
    p.add_argument("--stall_shutdown", type=float, default=900.0)
    p.add_argument("--export_graph_path", default=None, help="Config.export_graph_path; 'out': the --out directory")
    p.add_argument("--short_rank", type=int, default=-1, help="this rank runs one step fewer")
    p.add_argument("--kill_server_rank", type=int, default=-1, help="worker 0 kills this (server) rank")
    p.add_argument("--clip", type=float, default=None)
    p.add_argument("--async", dest="sync", action="store_false")
    p.add_argument("--protocol", default="grpc")
    p.add_argument("--no_local_aggregation", dest="local_aggregation", action="store_false")
    p.add_argument("--no_replicate_variables", dest="replicate_variables", action="store_false")
    p.add_argument("--no_boundary_among", dest="boundary_among", action="store_false")
    p.add_argument("--no_boundary_between", dest="boundary_between", action="store_false")
    p.add_argument("--num_servers", type=int, default=None, help="PSConfig.num_servers")
    p.add_argument("--overrides", default=None, help="Config.plan_overrides as JSON")
    p.add_argument("--search_partitions", action="store_true")
    p.add_argument("--ckpt_dir", default=None, help="CheckPointConfig.ckpt_dir; 'out': <out>/ckpt")
    p.add_argument("--save_steps", type=int, default=None)
    p.add_argument("--data_from_global_step", action="store_true", help="train on the batches of the global steps "
                   "after the one the job starts at (a resumed job: as if it had not stopped), not from batch 0")
    p.add_argument("--profile_dir", default=None)
    p.add_argument("--profile_steps", default=None, help="comma-separated steps")
    p.add_argument("--sess_threads", type=int, default=0, help="sess_config.intra_op_parallelism_threads")
    p.add_argument("--count_hook", action="store_true", help="a user hook counts the steps of every worker")
    p.add_argument("--count_gradients", action="store_true", help="count the training steps whose updates were "
                   "applied, in the variable applied_gradients (tests/models.py: count_applied_gradients)")
    p.add_argument("--zero_stage", type=int, default=0, help="Config.zero_stage; the slots are then not saved")
    p.add_argument("--pipeline_stages", type=int, default=1)
    p.add_argument("--micro_batches", type=int, default=1)
    p.add_argument("--pipeline_cuts", default=None, help="Config.pipeline_cuts, comma-separated")
    p.add_argument("--pipeline_schedule", default="gpipe")
    p.add_argument("--out", required=True)
    p.add_argument("--cases", default=None, help="a JSON file {name: [options...]}: train each case in turn, one "
                   "parallel_run call each, with these options added, into <out>/<name>")
    return p


def main() -> None:
    p = parser()
    args = p.parse_args()
    if not args.cases:
        train(args)
        return
    with open(args.cases) as f:
        cases = json.load(f)
    common = sys.argv[1:]
    for name, extra in cases.items():  # one job of processes, several training jobs one after the other
        case = p.parse_args(common + extra)
        case.out = os.path.join(args.out, name)
        train(case)


def train(args: argparse.Namespace) -> None:
    builder = BUILDERS[args.model]
    model = builder(args.optimizer, clip=args.clip) if args.clip else builder(args.optimizer)
    if args.count_gradients:
        model = count_applied_gradients(model)
    mpi = parallax.MPIConfig(backend=args.backend, use_allgatherv=args.use_allgatherv,
                             fusion_bytes=args.fusion_bytes, overlap=not args.no_overlap)
    ps = parallax.PSConfig(protocol=args.protocol, local_aggregation=args.local_aggregation,
                           replicate_variables=args.replicate_variables, boundary_among_servers=args.boundary_among,
                           boundary_between_workers_and_servers=args.boundary_between, num_servers=args.num_servers)
    hooks = [StepCounter(args.out)] if args.count_hook else None
    ckpt_dir = os.path.join(args.out, "ckpt") if args.ckpt_dir == "out" else args.ckpt_dir  # "out": the case's own
    ckpt = parallax.CheckPointConfig(ckpt_dir=ckpt_dir, save_ckpt_steps=args.save_steps)
    profile = parallax.ProfileConfig(profile_dir=args.profile_dir, profile_steps=[
        int(x) for x in args.profile_steps.split(",")] if args.profile_steps else None)
    sess_config = tf.compat.v1.ConfigProto(intra_op_parallelism_threads=args.sess_threads) \
        if args.sess_threads else None
    run_option = None if args.run_option == "default" else args.run_option
    config = parallax.Config(run_option=run_option, hooks=hooks, ckpt_config=ckpt, profile_config=profile,
                             sess_config=sess_config, stall_timeout=args.stall_timeout,
                             stall_shutdown=args.stall_shutdown,
                             export_graph_path=args.out if args.export_graph_path == "out" else args.export_graph_path,
                             average_sparse=args.average_sparse,
                             redirect_path=args.redirect_path, search_partitions=args.search_partitions,
                             plan_overrides=json.loads(args.overrides) if args.overrides else None,
                             zero_stage=args.zero_stage, pipeline_stages=args.pipeline_stages,
                             micro_batches=args.micro_batches, pipeline_schedule=args.pipeline_schedule,
                             pipeline_cuts=args.pipeline_cuts.split(",") if args.pipeline_cuts else None,
                             communication_config=parallax.CommunicationConfig(ps_config=ps, mpi_config=mpi,
                                                                               compression=args.compression))
    sess, num_workers, worker_id, num_replicas = parallax.parallel_run(model.graph, args.resource_info,
                                                                       sync=args.sync, parallax_config=config)
    PAUSE["seconds"] = 0.5 if worker_id == 0 else 0.0  # slow_ema: a chief slower after its update
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, f"started_{worker_id}"), "w") as f:  # for tests that act mid-run
        json.dump({"num_workers": num_workers, "worker_id": worker_id, "num_replicas": num_replicas,
                   "mpi": "mpi4py.MPI" in sys.modules}, f)
    step_var = tf.compat.v1.train.get_global_step(model.graph)
    start = 0
    if step_var is not None:
        start = int(sess.run(step_var)[0])
        print(f"worker {worker_id} starts at global step {start}", flush=True)
    first = start if args.data_from_global_step else 0  # the index of the first batch (and schedule step)
    data = DATA[args.model](first + args.steps, args.batch)[first:]
    parts = num_workers * num_replicas
    if model.initializer is not None:  # tf.data input: nothing to feed
        sess.run(model.initializer)
        data = [{} for _ in data]
    if worker_id == args.short_rank:
        data = data[:-1]
    for step, feed in enumerate(data):
        if worker_id == args.kill_rank and step == args.kill_step:
            kill(os.getpid(), args.out)
        if worker_id == 0 and args.kill_server_rank >= 0 and step == args.kill_step:
            registry = os.path.join(os.environ["PARALLAX_JOB_DIR"], f"rank_{args.kill_server_rank}.json")
            with open(registry) as f:
                kill(json.load(f)["pid"], args.out)
        if worker_id == args.sleep_rank and step == args.kill_step:
            time.sleep(args.sleep_seconds)
        if worker_id == args.raise_rank and step == args.kill_step:
            note_time(args.out, "raised_at")
            raise RuntimeError(f"deliberate failure on rank {worker_id}")
        mine = {model.inputs[k]: np.split(v, parts)[worker_id * num_replicas:(worker_id + 1) * num_replicas]
                for k, v in feed.items()}
        sess.run(model.step_op(first + step), feed_dict=mine)
    variables = model.graph.get_collection(tf.compat.v1.GraphKeys.GLOBAL_VARIABLES)
    if args.zero_stage:  # a worker holds a part of each slot only
        variables = [v for v in variables if not is_slot(v, model.graph)]
    values = sess.run(variables)
    os.makedirs(args.out, exist_ok=True)
    np.savez(os.path.join(args.out, f"rank_{worker_id}.npz"),
             **{v.op.name.replace("/", "__"): value[0] for v, value in zip(variables, values)})
    print(f"rank {worker_id} of {num_workers} done", flush=True)
    sess.close()


if __name__ == "__main__":
    main()
