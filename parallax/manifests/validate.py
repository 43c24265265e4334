"""Check written manifests with each manager's own published schema or parser.

=========  ============================================================================
kind       validator
=========  ============================================================================
tfjob      the training operator's TFJob CRD (``openAPIV3Schema``, vendored in
           ``schemas/``) with ``openapi-schema-validator``, strict as
           ``kubectl apply --validate=strict``: unknown fields and replica types are errors
mpijob     the MPI Operator's MPIJob CRD, the same way
polyaxon   Polyaxon's own reader (``polyaxon.polyaxonfile.check_polyaxonfile``,
           ``pip install polyaxon``)
condor     HTCondor's submit parser (``htcondor.Submit``: the submit description is
           expanded into the job's ClassAd, ``pip install htcondor``); the scripts with
           ``bash -n`` / ``sh -n``
slurm      ``sbatch --test-only`` (with the machine's Slurm configuration, or a minimal
           one that lets sbatch check its options without a controller); ``bash -n``
=========  ============================================================================

:func:`validate` returns what was checked and the problems found; a validator that is
not installed is reported as such, not passed silently.
"""

from __future__ import annotations

import copy
import gzip
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from functools import cache

__all__ = ["Validation", "validate", "crd_schema"]

_SCHEMAS = os.path.join(os.path.dirname(__file__), "schemas")
_CRDS = {"tfjob": ("kubeflow.org_tfjobs.yaml.gz", "v1", "tfReplicaSpecs", ("Chief", "Master", "Worker", "PS",
                                                                           "Evaluator")),
         "mpijob": ("kubeflow.org_mpijobs.yaml.gz", "v2beta1", "mpiReplicaSpecs", ("Launcher", "Worker"))}
_MINIMAL_SLURM_CONF = """ClusterName=parallax-check
GresTypes=gpu
SlurmctldHost=localhost
SlurmctldPort={port}
NodeName=localhost CPUs=1 State=UNKNOWN
PartitionName=check Nodes=localhost Default=YES
MessageTimeout=1
TCPTimeout=1
"""


@dataclass(frozen=True)
class Validation:
    """What checked a manifest (``by``), and the problems it found (empty: valid); ``missing``: the
    validator is not installed (``by`` then says what to install)."""

    by: str
    problems: tuple[str, ...] = ()
    missing: bool = False

    @property
    def ok(self) -> bool:
        return not self.problems and not self.missing


def validate(kind: str, files: dict[str, str]) -> list[Validation]:
    """Check every file of a manifest of ``kind`` (file name -> text)."""
    out = []
    for name, text in files.items():
        if name.endswith(".yaml") and kind in _CRDS:
            out.append(_crd(kind, name, text))
        elif kind == "polyaxon":
            out.append(_polyaxon(name, text))
        elif name.endswith(".sub"):
            out.append(_condor_submit(name, text))
        elif name.endswith(".sbatch"):
            out.extend([_shell(name, text, "bash"), _sbatch(name, text)])
        elif name.endswith(".sh"):
            out.append(_shell(name, text, "bash" if text.startswith("#!/bin/bash") else "sh"))
    return out


@cache
def crd_schema(kind: str) -> dict:
    """The ``openAPIV3Schema`` of the vendored CRD of ``kind``, made strict (see the module docstring)."""
    import yaml

    path, version, replicas, types = _CRDS[kind]
    with gzip.open(os.path.join(_SCHEMAS, path), "rt", encoding="utf-8") as f:
        crd = yaml.safe_load(f)
    schema = next(v for v in crd["spec"]["versions"] if v["name"] == version)["schema"]["openAPIV3Schema"]
    schema = _strict(copy.deepcopy(schema))
    specs = schema["properties"]["spec"]["properties"][replicas]  # a map of replica specs: only the operator's types
    specs["properties"] = {t: specs["additionalProperties"] for t in types}
    specs["additionalProperties"] = False
    schema["properties"]["apiVersion"]["enum"] = [f"kubeflow.org/{version}"]
    schema["properties"]["kind"]["enum"] = [crd["spec"]["names"]["kind"]]
    schema["required"] = sorted({*schema.get("required", ()), "apiVersion", "kind", "metadata", "spec"})
    return schema


def _strict(node):
    """Unknown fields are errors (as ``kubectl --validate=strict``; the API server would drop them)."""
    if isinstance(node, dict):
        if "properties" in node and "additionalProperties" not in node \
                and not node.get("x-kubernetes-preserve-unknown-fields"):
            node["additionalProperties"] = False
        for value in node.values():
            _strict(value)
    elif isinstance(node, list):
        for value in node:
            _strict(value)
    return node


def _crd(kind: str, name: str, text: str) -> Validation:
    import yaml

    by = f"{name}: the {_CRDS[kind][0].split('_')[1].split('.')[0]} CRD schema (openapi-schema-validator)"
    try:
        from openapi_schema_validator import OAS30Validator, oas30_format_checker
    except ImportError:
        return Validation(f"{name}: pip install openapi-schema-validator to validate", missing=True)
    doc = yaml.safe_load(text)
    validator = OAS30Validator(crd_schema(kind), format_checker=oas30_format_checker)
    problems = [f"{'.'.join(map(str, e.absolute_path)) or '<top>'}: {e.message}"
                for e in sorted(validator.iter_errors(doc), key=lambda e: list(map(str, e.absolute_path)))]
    return Validation(by, tuple(problems))


def _polyaxon(name: str, text: str) -> Validation:
    try:
        from polyaxon.polyaxonfile import check_polyaxonfile
    except ImportError:
        return Validation(f"{name}: pip install polyaxon to validate", missing=True)
    import yaml

    by = f"{name}: polyaxon.polyaxonfile.check_polyaxonfile"
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, name)
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
        try:
            check_polyaxonfile(polyaxonfile=path, is_cli=False, verbose=False, to_op=True)
        except Exception as e:  # noqa: BLE001 - polyaxon's errors (PolyaxonfileError, pydantic's)
            return Validation(by, (_polyaxon_detail(yaml.safe_load(text)) or str(e).strip(),))
    return Validation(by)


def _polyaxon_detail(doc: dict) -> str | None:
    """The run section's own error (the component's message lists every field of every run kind)."""
    from polyaxon.schemas import V1TFJob

    try:
        V1TFJob.model_validate((doc or {}).get("run") or {})
    except Exception as e:  # noqa: BLE001 - pydantic's ValidationError
        return " ".join(str(e).split("\n")[:3])
    return None


def _condor_submit(name: str, text: str) -> Validation:
    os.environ.setdefault("CONDOR_CONFIG", "/dev/null")  # no pool: the parser alone
    try:
        import classad
        import htcondor
    except ImportError:
        return Validation(f"{name}: pip install 'htcondor<25' to validate (its v1 bindings expand a submit file "
                          "without a pool)", missing=True)
    by = f"{name}: htcondor.Submit (the job's ClassAd)"
    try:
        submit = htcondor.Submit(text)
        submit.itemdata()
        ad = next(iter(submit.jobs(count=1, clusterid=1)))
    except Exception as e:  # noqa: BLE001 - the bindings raise plain RuntimeError/ValueError
        return Validation(by, (str(e).strip() or f"{type(e).__name__} (an unreadable line)",))
    problems = [f"{key} = {ad.lookup(key)} does not evaluate" for key in
                ("JobUniverse", "Cmd", "MinHosts", "RequestCpus", "RequestGpus", "RequestMemory")
                if key in ad and isinstance(ad.eval(key), classad.Value)]
    if "queue" not in {line.split()[0].lower() for line in text.splitlines() if line.strip()}:
        problems.append("no queue statement: nothing would be submitted")
    if ad.eval("JobUniverse") == 11 and not ad.eval("MinHosts"):
        problems.append("a parallel-universe job needs machine_count >= 1")
    return Validation(by, tuple(problems))


def _shell(name: str, text: str, shell: str) -> Validation:
    proc = subprocess.run([shell, "-n"], input=text, capture_output=True, text=True, timeout=30)
    return Validation(f"{name}: {shell} -n", tuple(proc.stderr.strip().splitlines()) if proc.returncode else ())


def _sbatch(name: str, text: str) -> Validation:
    """``sbatch --test-only``: with this machine's Slurm when its controller answers (it says when the job
    could start), else with a minimal configuration: sbatch checks its options, then finds no controller."""
    sbatch = shutil.which("sbatch")
    if sbatch is None:
        return Validation(f"{name}: install Slurm's sbatch (Debian: slurm-client) to validate", missing=True)
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, name)
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
        own = None
        if not (os.environ.get("SLURM_CONF") or os.path.exists("/etc/slurm/slurm.conf")):
            own = _minimal_conf(tmp)
        code, output = _test_only(sbatch, path, own)
        if own is None and "Unable to contact slurm controller" in output:
            own = _minimal_conf(tmp)
            code, output = _test_only(sbatch, path, own)
    by = f"{name}: sbatch --test-only" + (" (its options: no Slurm controller answers here)" if own else "")
    if code == 0 or (own and "Unable to contact slurm controller" in output):
        return Validation(by)
    return Validation(by, tuple(line for line in output.splitlines() if line.strip())[:5])


def _minimal_conf(directory: str) -> str:
    path = os.path.join(directory, "slurm.conf")
    with open(path, "w", encoding="utf-8") as f:
        f.write(_MINIMAL_SLURM_CONF.format(port=_closed_port()))
    return path


def _test_only(sbatch: str, path: str, conf: str | None) -> tuple[int, str]:
    env = dict(os.environ, **({"SLURM_CONF": conf} if conf else {}))
    proc = subprocess.run([sbatch, "--test-only", path], capture_output=True, text=True, env=env, timeout=60)
    return proc.returncode, (proc.stdout + proc.stderr).strip()


def _closed_port() -> int:
    """A loopback port nothing listens on (sbatch then fails to contact a controller at once)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
