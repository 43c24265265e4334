"""Command line: ``parallax-run`` and ``parallax {run,plan}``.

``parallax-run`` (= ``parallax run``) runs a training script on the devices of
a resource file:

    parallax-run --resource_info resource_info train.py --steps 1000
    parallax-run --resource_info resource_info -m mypackage.train
    parallax-run --resource_info resource_info --mpirun_options "--mca btl_tcp_if_include eth0" train.py

The script calls ``parallax.parallel_run(graph, <a resource file>, parallax_config=...)``
as usual. ``parallax-run`` starts it with this Python, and its ``parallel_run``
uses the resource file given here (instead of the one the script names), adds
the ``--mpirun_options`` to ``MPIConfig.mpirun_options``, and launches the
processes its run option needs (one per device for MPI, workers and servers
for PS and HYBRID) through ``mpirun``, exactly as when the script is run with
plain ``python``. ``--dry_run`` prints the ``mpirun`` command instead.

``parallax plan`` prints the plan a training script would use, without training:

    parallax plan train.py resource_info [--run_option AUTO] [--override emb=ps] [-- script args]

The script runs up to its ``parallel_run`` call, which prints the plan (and
writes it as JSON with ``--json``) and ends the script. The resource file and
run option given here replace the script's own.

The package, one job a module: :mod:`~parallax.cli.run` (``parallax-run``),
:mod:`~parallax.cli.plan` (``parallax plan``), :mod:`~parallax.cli.manifest`
(``parallax manifest``), :mod:`~parallax.cli.tune` (``parallax tune``),
:mod:`~parallax.cli.probe` (``parallax probe``), :mod:`~parallax.cli.commands`
(``parallax``, which hands its arguments to one of them),
:mod:`~parallax.cli.arguments` (the argument types and the split at ``--`` they
share) and :mod:`~parallax.cli.script` (the training script run as a process of
its own). ``python -m parallax.cli`` is ``parallax-run``.
"""

from __future__ import annotations

# `noqa: F401`: the private names are imported only so that every name of the module this package was stays
# importable from parallax.cli (tests import _parser and _elastic_options from here).
from parallax.cli.arguments import (  # noqa: F401
    _count_arg,
    _parse_own,
    _port_arg,
    _seconds_arg,
    _shutdown_arg,
    _split_command,
    _whole_arg,
)
from parallax.cli.commands import parallax_main
from parallax.cli.manifest import _K8S_NAME, _manifest_parser, manifest_main  # noqa: F401
from parallax.cli.plan import (  # noqa: F401
    _plan_parser,
    _prediction_inputs,
    _print_prediction,
    _probed,
    _seconds,
    plan_main,
)
from parallax.cli.probe import _link_text, probe_main  # noqa: F401
from parallax.cli.run import _check, _elastic_options, _parser, main  # noqa: F401
from parallax.cli.script import _run_forwarding_sigterm, _run_to_parallel_run  # noqa: F401
from parallax.cli.tune import _space_value, _tune_parser, parse_space, tune_main  # noqa: F401

__all__ = ["main", "parallax_main", "plan_main", "manifest_main", "probe_main", "tune_main"]
