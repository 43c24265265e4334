"""Role specs: a job described by its roles, as Polyaxon's ``environment`` section (seed 003).

A role spec says how many tasks of each role a job has and what each needs,
not where they run::

    environment:
      resources:                 # the master's (worker 0)
        cpu: {requests: 1, limits: 2}
        gpu: {requests: 1, limits: 1}
      tensorflow:
        n_workers: 2             # besides the master
        n_ps: 1
        default_worker:
          resources: {gpu: {limits: 1}}
        worker:
          - index: 1
            resources: {gpu: {limits: 2}}
        default_ps:
          resources: {cpu: {requests: 1, limits: 1}}

It is accepted wherever a resource file is (:func:`parallax.resources.files.parse_resource_text`
tells it by its first line): on one machine every task runs on ``localhost``,
worker ``k`` on the next GPUs in turn (one CPU replica without GPUs), each ps as a
parameter server; ``parallax manifest`` turns the same spec into what a cluster
manager runs. The spec may be the section itself or a whole polyaxonfile (only its
``environment`` is read). It is checked against a JSON Schema (:data:`SCHEMA`,
with ``jsonschema``); an error names the file, the line and the key.

``request``/``limit`` are read as ``requests``/``limits`` (the seed's own example
writes ``gpu: {request: 1}``). A worker without resources of its own or a
``default_worker`` has the master's.

Every key is checked: one that Polyaxon does not know (a misspelt ``tensorfow:``) is
refused, naming the file, the line, the key, the close match (:mod:`difflib`) and the
keys expected there; Polyaxon's own keys that say nothing about the roles
(``node_selector``, ``tolerations``, ...) are accepted and not read.

The polyaxonfile ``parallax manifest --kind polyaxon`` writes (Polyaxon v1.1, a component
whose ``run`` is a ``tfjob``) is read as the job it describes: the ``chief`` replica is the
master (else the first ``worker`` replica), then the ``worker`` replicas, then the ``ps``
replicas, each with its container's Kubernetes ``resources`` (cpu, memory in MB, and
``nvidia.com/gpu``); an ``evaluator`` takes no part in training.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass
from typing import Any

from parallax.errors import ResourceFileError
from parallax.resources.cluster import Cluster, Device, Role, ServerTask, WorkerTask

__all__ = ["Resources", "RoleTask", "RoleSpec", "SCHEMA", "looks_like_role_spec", "parse_role_spec"]

#: Keys of Polyaxon's ``environment`` section that say nothing about the roles: accepted, not read.
IGNORED_ENVIRONMENT_KEYS = ("node_selector", "tolerations", "affinity", "annotations", "labels", "persistence",
                            "data_refs", "artifact_refs", "outputs", "config_map_refs", "configmap_refs",
                            "secret_refs", "service_account", "service_account_name", "image_pull_secrets",
                            "max_restarts", "security_context", "env_vars")
_FRAMEWORKS = ("mxnet", "pytorch", "horovod")
#: The top-level keys of a (pre-v1) polyaxonfile besides ``environment``: accepted, not read.
POLYAXONFILE_KEYS = ("version", "kind", "name", "description", "tags", "logging", "project", "declarations",
                     "params", "build", "run", "hptuning", "matrix", "settings", "framework", "backend", "inputs",
                     "outputs")
_NUMBER = {"type": "number", "minimum": 0}
_QUANTITY = {"type": "object", "additionalProperties": False,
             "properties": {k: _NUMBER for k in ("requests", "request", "limits", "limit")}}
_GPU = {"type": "object", "additionalProperties": False,
        "properties": {k: {"type": "integer", "minimum": 0} for k in ("requests", "request", "limits", "limit")}}
_RESOURCES = {"type": "object", "additionalProperties": False,
              "properties": {"cpu": _QUANTITY, "memory": _QUANTITY, "gpu": _GPU}}
_ROLE = {"type": "object", "additionalProperties": False, "properties": {"resources": _RESOURCES}}
_OVERRIDE = {"type": "object", "additionalProperties": False, "required": ["index"],
             "properties": {"index": {"type": "integer", "minimum": 0}, "resources": _RESOURCES}}
_TENSORFLOW = {"type": "object", "additionalProperties": False,
               "properties": {"n_workers": {"type": "integer", "minimum": 0},
                              "n_ps": {"type": "integer", "minimum": 0},
                              "default_worker": _ROLE, "default_ps": _ROLE,
                              "worker": {"type": "array", "items": _OVERRIDE},
                              "ps": {"type": "array", "items": _OVERRIDE}}}
_ENVIRONMENT = {"type": "object", "additionalProperties": False,
                "properties": {"resources": _RESOURCES, "tensorflow": _TENSORFLOW,
                               **{k: {} for k in (*IGNORED_ENVIRONMENT_KEYS, *_FRAMEWORKS)}},
                "x-ignored": [*IGNORED_ENVIRONMENT_KEYS, *_FRAMEWORKS],
                "not": {"anyOf": [{"required": [k]} for k in _FRAMEWORKS]}}
_POLYAXONFILE = {"type": "object", "additionalProperties": False,
                 "properties": {"environment": _ENVIRONMENT, **{k: {} for k in POLYAXONFILE_KEYS}},
                 "x-ignored": list(POLYAXONFILE_KEYS)}
#: The JSON Schema a role spec is checked against: a polyaxonfile (its ``environment`` read), or the
#: section itself. (A v1.1 polyaxonfile, whose ``run`` is a ``tfjob``, is read by its own rules.)
SCHEMA = {"$schema": "https://json-schema.org/draft/2020-12/schema", "anyOf": [_POLYAXONFILE, _ENVIRONMENT]}
_FIRST_KEYS = ("environment", "resources", "tensorflow", *IGNORED_ENVIRONMENT_KEYS, *POLYAXONFILE_KEYS)


@dataclass(frozen=True)
class Resources:
    """What a task asks for: ``(requests, limits)`` of cpu (cores), memory (MB) and gpu."""

    cpu: tuple[float | None, float | None] = (None, None)
    memory: tuple[float | None, float | None] = (None, None)
    gpu: tuple[int | None, int | None] = (None, None)

    @property
    def gpus(self) -> int:
        """GPUs the task gets: its limit, else its request, else none."""
        requests, limits = self.gpu
        return int(limits if limits is not None else requests or 0)

    @classmethod
    def from_dict(cls, data: dict | None) -> Resources:
        def pair(d: dict | None) -> tuple:
            d = d or {}
            return (d.get("requests", d.get("request")), d.get("limits", d.get("limit")))

        data = data or {}
        return cls(pair(data.get("cpu")), pair(data.get("memory")), pair(data.get("gpu")))


@dataclass(frozen=True)
class RoleTask:
    """One task: ``role`` is ``Role.MASTER``, ``Role.WORKER`` or ``Role.PS``; ``line`` where the spec defines it."""

    role: Role
    index: int
    resources: Resources
    line: int


@dataclass(frozen=True)
class RoleSpec:
    """Every task of a role spec, the master first, then the workers, then the ps tasks."""

    tasks: tuple[RoleTask, ...]
    source: str
    text: str

    def of(self, role: Role) -> tuple[RoleTask, ...]:
        return tuple(t for t in self.tasks if t.role == role)

    def cluster(self, host: str = "localhost") -> Cluster:
        """The spec's tasks on one machine: the master and the workers, each on the next GPUs in turn
        (one CPU replica without GPUs), and the ps tasks as parameter servers."""
        workers, gpu = [], 0
        for t in self.tasks:
            if t.role == Role.PS:
                continue
            n = t.resources.gpus
            devices = tuple(Device("gpu", gpu + i) for i in range(n)) if n else (Device("cpu", 0),)
            gpu += n
            workers.append(WorkerTask(host, devices, None, t.line))
        servers = tuple(ServerTask(host, None, t.line) for t in self.of(Role.PS))
        return Cluster(tuple(workers), servers, self.source, explicit_roles=True, text=self.text)


def looks_like_role_spec(text: str) -> bool:
    """Whether ``text``'s first meaningful line starts a role spec: a key of a polyaxonfile or of its
    ``environment`` section (``environment:``, ``tensorflow:``, ``version:``, ...), or a bare ``key:``
    close to one (a misspelling, refused by :func:`parse_role_spec` with the close match)."""
    for raw in text.splitlines():
        line = raw.split("#", 1)[0].rstrip()
        if line.strip():
            key = re.match(r"^([A-Za-z_][A-Za-z0-9_]*):(\s|$)", line)
            return bool(key) and (key.group(1) in _FIRST_KEYS or (
                not line[key.end():].strip() and bool(difflib.get_close_matches(key.group(1), _FIRST_KEYS, 1))))
    return False


def parse_role_spec(text: str, source: str = "<role spec>") -> RoleSpec:
    """Parse and check a role spec: Polyaxon's ``environment`` section, a polyaxonfile holding one, or
    a v1.1 polyaxonfile whose ``run`` is a ``tfjob`` (as ``parallax manifest --kind polyaxon`` writes).

    Raises:
        ResourceFileError: naming ``source``, the line and the key, and what was expected.
    """
    import jsonschema
    import yaml

    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f", line {mark.line + 1}" if mark is not None else ""
        raise ResourceFileError(f"{source}{where}: not valid YAML: {getattr(e, 'problem', e)}") from e
    if not isinstance(data, dict):
        raise ResourceFileError(f"{source}: a role spec is a YAML mapping (environment:, tensorflow:, ...), not "
                                f"{type(data).__name__}")
    if _is_v1(data):
        return RoleSpec(_v1_tasks(data, root, source), source, text)
    shape = _POLYAXONFILE if "environment" in data or set(data) & set(POLYAXONFILE_KEYS) else _ENVIRONMENT
    errors = sorted(jsonschema.Draft202012Validator(shape).iter_errors(data), key=lambda e: -len(e.absolute_path))
    if errors:
        raise _schema_error(source, root, errors)
    environment = (data.get("environment") or {}) if shape is _POLYAXONFILE else data
    tensorflow = environment.get("tensorflow") or {}
    line = _line_of(root, ["environment"] if "environment" in data else [])
    master = Resources.from_dict(environment.get("resources"))
    tasks = [RoleTask(Role.MASTER, 0, master, _line_of(root, _path(data, "resources")) or line)]
    for role, default_role in ((Role.WORKER, "default_worker"), (Role.PS, "default_ps")):
        count = tensorflow.get(f"n_{role}s" if role == Role.WORKER else "n_ps", 0)
        default = (tensorflow.get(default_role) or {}).get("resources")
        overrides = {}
        for i, entry in enumerate(tensorflow.get(role) or []):
            where = _line_of(root, [*_path(data, "tensorflow"), role, i])
            if entry["index"] >= count:
                raise ResourceFileError(f"{source}, line {where}: tensorflow.{role}[{i}] has index {entry['index']}, "
                                        f"but n_{'workers' if role == Role.WORKER else 'ps'} is {count}. Expected an "
                                        f"index from 0 to {count - 1}")
            overrides[entry["index"]] = (entry.get("resources"), where)
        count_line = _line_of(root, [*_path(data, "tensorflow"), f"n_{role}s" if role == Role.WORKER else "n_ps"])
        for index in range(count):
            resources, where = overrides.get(index, (None, count_line))
            if resources is None:
                resources = default
            chosen = Resources.from_dict(resources) if resources is not None else \
                (master if role == Role.WORKER else Resources())
            tasks.append(RoleTask(role, index, chosen, where or line))
    return RoleSpec(tuple(tasks), source, text)


# --------------------------------------------------------------------------- #
# v1.1 polyaxonfiles: a component whose run is a tfjob
# --------------------------------------------------------------------------- #

#: A v1 component's (or operation's) top-level keys (Polyaxon's V1Component, V1Operation).
V1_KEYS = ("version", "kind", "name", "description", "tags", "presets", "queue", "cache", "termination", "plugins",
           "build", "hooks", "inputs", "outputs", "template", "run", "params", "component", "hubRef", "dagRef",
           "urlRef", "pathRef", "runPatch", "patchStrategy", "matrix", "joins", "schedule", "events",
           "dependencies", "trigger", "conditions", "skipOnUpstreamSkip", "isPreset", "isApproved", "cost", "owner",
           "project")
#: A tfjob run's keys (Polyaxon's V1TFJob): the replicas Parallax reads, and the policies it does not.
TFJOB_KEYS = ("kind", "chief", "worker", "ps", "evaluator", "cleanPodPolicy", "schedulingPolicy", "successPolicy",
              "enableDynamicWorker")
#: A replica's keys (Polyaxon's V1KFReplica).
REPLICA_KEYS = ("replicas", "container", "environment", "connections", "volumes", "init", "sidecars")
GPU_RESOURCE = "nvidia.com/gpu"
_MEMORY_UNITS = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "k": 1e3, "K": 1e3, "M": 1e6, "G": 1e9,
                 "T": 1e12, "": 1}


def _is_v1(data: dict) -> bool:
    """A Polyaxon v1 polyaxonfile: a component or operation (``run`` with a ``kind``, or ``version`` >= 1.1)."""
    run = (data.get("component") or {}).get("run") if isinstance(data.get("component"), dict) else data.get("run")
    return data.get("kind") in ("component", "operation") or (isinstance(run, dict) and "kind" in run)


def _v1_tasks(data: dict, root: Any, source: str) -> tuple[RoleTask, ...]:
    """The tasks of a v1 polyaxonfile's ``tfjob`` run: the chief (else the first worker) as the master,
    the workers, the ps tasks."""
    _check_keys(data, [], V1_KEYS, root, source, "a Polyaxon v1 component's keys")
    base = ["component"] if isinstance(data.get("component"), dict) and "run" not in data else []
    component = data["component"] if base else data
    if base:
        _check_keys(component, base, V1_KEYS, root, source, "a Polyaxon v1 component's keys")
    run = component.get("run")
    if not isinstance(run, dict):
        raise ResourceFileError(f"{source}, line {_line_of(root, base)}: a Polyaxon v1 polyaxonfile without a run "
                                f"of kind tfjob (its {_key_text([*base, 'run'])} is {type(run).__name__}); expected "
                                "run: {kind: tfjob, chief: {replicas: 1, container: ...}, worker: ..., ps: ...}")
    at = [*base, "run"]
    if run.get("kind") != "tfjob":
        raise ResourceFileError(f"{source}, line {_line_of(root, [*at, 'kind'])}: {_key_text([*at, 'kind'])} is "
                                f"{run.get('kind')!r}; expected 'tfjob' (a chief, workers and ps tasks: the roles "
                                "Parallax trains with)")
    _check_keys(run, at, TFJOB_KEYS, root, source, "a tfjob's keys")
    replicas: dict[str, list[tuple[Resources, int]]] = {}
    for role in ("chief", "worker", "ps"):
        spec = run.get(role)
        if spec is None:
            replicas[role] = []
            continue
        where = [*at, role]
        if not isinstance(spec, dict):
            raise ResourceFileError(f"{source}, line {_line_of(root, where)}: {_key_text(where)} is "
                                    f"{type(spec).__name__}; expected {{replicas: <n>, container: {{...}}}}")
        _check_keys(spec, where, REPLICA_KEYS, root, source, "a replica's keys")
        count = spec.get("replicas", 1)
        if isinstance(count, bool) or not isinstance(count, int) or count < 0:
            raise ResourceFileError(f"{source}, line {_line_of(root, [*where, 'replicas'])}: "
                                    f"{_key_text([*where, 'replicas'])} is {count!r}; expected an integer >= 0")
        resources = _k8s_resources(spec.get("container"), [*where, "container"], root, source)
        replicas[role] = [(resources, _line_of(root, where))] * count
    if len(replicas["chief"]) > 1:
        raise ResourceFileError(f"{source}, line {_line_of(root, [*at, 'chief', 'replicas'])}: "
                                f"{_key_text([*at, 'chief', 'replicas'])} is {len(replicas['chief'])}; expected at "
                                "most 1 (the chief is worker 0)")
    trainers = replicas["chief"] + replicas["worker"]
    if not trainers:
        raise ResourceFileError(f"{source}, line {_line_of(root, at)}: {_key_text(at)} has no chief or worker "
                                "replica; expected at least one task that trains")
    tasks = [RoleTask(Role.MASTER, 0, *trainers[0])]
    tasks += [RoleTask(Role.WORKER, i, *r) for i, r in enumerate(trainers[1:])]
    tasks += [RoleTask(Role.PS, i, *r) for i, r in enumerate(replicas["ps"])]
    return tuple(tasks)


def _check_keys(mapping: dict, path: list, known: tuple[str, ...], root: Any, source: str, what: str) -> None:
    for key in mapping:
        if key not in known:
            raise ResourceFileError(f"{source}, line {_line_of(root, [*path, key])}: "
                                    f"{_unknown_key(_key_text(path), key, {'properties': dict.fromkeys(known)})} "
                                    f"({what})")


def _k8s_resources(container: Any, path: list, root: Any, source: str) -> Resources:
    """A container's Kubernetes ``resources`` as :class:`Resources` (cpu in cores, memory in MB)."""
    if container is None:
        return Resources()
    if not isinstance(container, dict) or not isinstance(container.get("resources", {}), dict):
        raise ResourceFileError(f"{source}, line {_line_of(root, path)}: {_key_text(path)} is not a container "
                                "mapping with resources: {requests: {...}, limits: {...}}")
    resources = container.get("resources") or {}
    pairs: dict[str, list] = {"cpu": [None, None], "memory": [None, None], "gpu": [None, None]}
    for i, side in enumerate(("requests", "limits")):
        values = resources.get(side) or {}
        where = [*path, "resources", side]
        if not isinstance(values, dict):
            raise ResourceFileError(f"{source}, line {_line_of(root, where)}: {_key_text(where)} is "
                                    f"{type(values).__name__}; expected a mapping of resource name -> quantity")
        for name, parse in (("cpu", _cores), ("memory", _megabytes), (GPU_RESOURCE, _gpus)):
            if name in values:
                try:
                    pairs["gpu" if name == GPU_RESOURCE else name][i] = parse(values[name])
                except ValueError as e:
                    raise ResourceFileError(f"{source}, line {_line_of(root, [*where, name])}: "
                                            f"{_key_text(where)}.{name} is {values[name]!r}; {e}") from None
    return Resources(tuple(pairs["cpu"]), tuple(pairs["memory"]), tuple(pairs["gpu"]))


def _cores(value: Any) -> float:
    """``"500m"`` -> 0.5, ``"2"`` or 2 -> 2.0."""
    text = str(value).strip()
    try:
        return float(text[:-1]) / 1000 if text.endswith("m") else float(text)
    except ValueError:
        raise ValueError("expected cores, e.g. 2 or '500m'") from None


def _megabytes(value: Any) -> float:
    """``"512Mi"`` -> 512, ``"1Gi"`` -> 1024, ``"1G"`` -> 953.67 (MB: 2**20 bytes, as ``parallax manifest`` writes)."""
    match = re.match(r"^([0-9.]+(?:[eE][0-9]+)?)\s*(Ki|Mi|Gi|Ti|k|K|M|G|T|)$", str(value).strip())
    if not match:
        raise ValueError("expected a Kubernetes memory quantity, e.g. '512Mi' or '8Gi'")
    return float(match.group(1)) * _MEMORY_UNITS[match.group(2)] / 2**20


def _gpus(value: Any) -> int:
    try:
        count = int(str(value).strip())
    except ValueError:
        raise ValueError("expected a whole number of GPUs") from None
    if count < 0:
        raise ValueError("expected a whole number of GPUs >= 0")
    return count


def _path(data: dict, key: str) -> list:
    return ["environment", key] if "environment" in data else [key]


def _node_at(root: Any, path: list, exact: bool = False) -> Any:
    """The YAML node at ``path`` (keys and list indexes) of the composed document; where the path
    leaves the document, the nearest node there is (``None`` with ``exact``)."""
    import yaml

    node = root
    for key in path:
        if isinstance(node, yaml.MappingNode):
            found = next((v for k, v in node.value if k.value == key), None)
        elif isinstance(node, yaml.SequenceNode) and isinstance(key, int) and key < len(node.value):
            found = node.value[key]
        else:
            found = None
        if found is None:
            return None if exact else node  # below a scalar (or a missing key)
        node = found
    return node


def _line_of(root: Any, path: list) -> int:
    """The line of ``path`` in the document: of its key when it ends in one (``tensorflow:``), else of
    the node there (a list item), else of the nearest node above it."""
    import yaml

    parent = _node_at(root, path[:-1], exact=True) if path else None
    if isinstance(parent, yaml.MappingNode):
        for key, _ in parent.value:
            if key.value == path[-1]:
                return key.start_mark.line + 1
    node = _node_at(root, path)
    return node.start_mark.line + 1 if node is not None else 0


def _schema_error(source: str, root: Any, errors: list) -> ResourceFileError:
    error = errors[0]
    path = list(error.absolute_path)
    line = _line_of(root, path)
    key = _key_text(path)
    if error.validator == "additionalProperties":
        extra = sorted(set(error.instance) - set(error.schema.get("properties", {})))
        node_line = _line_of(root, [*path, extra[0]]) if extra else line
        unknown = _unknown_key(key, extra[0] if extra else "?", error.schema)
        return ResourceFileError(f"{source}, line {node_line}: {unknown}")
    if error.validator == "not":
        other = next((f for f in _FRAMEWORKS if f in error.instance), None)
        line = _line_of(root, [*path, other]) if other else line
        return ResourceFileError(f"{source}, line {line}: {key} describes another framework (mxnet, pytorch or "
                                 "horovod); expected a tensorflow section")
    return ResourceFileError(f"{source}, line {line}: {key} {error.message}; expected "
                             f"{_expected(error)}")


def _key_text(path: list) -> str:
    return ".".join(str(p) if not isinstance(p, int) else f"[{p}]" for p in path).replace(".[", "[") or "the top level"


def _unknown_key(where: str, key: str, schema: dict) -> str:
    """``environment has the key "tensorfow" (did you mean "tensorflow"?); expected one of: ...``: the keys
    Parallax reads first, then those it accepts without reading."""
    known = list(schema.get("properties", {}))
    ignored = [k for k in schema.get("x-ignored", []) if k in known and k not in _FRAMEWORKS]
    read = [k for k in known if k not in schema.get("x-ignored", [])]
    close = difflib.get_close_matches(str(key), known, 1)
    guess = f" (did you mean \"{close[0]}\"?)" if close else ""
    text = f"{where} has the key \"{key}\"{guess}; expected one of: {', '.join(read)}"
    return text + (f" (or a key Polyaxon reads and Parallax does not: {', '.join(ignored)})" if ignored else "")


def _expected(error: Any) -> str:
    schema = error.schema
    if error.validator in ("type", "minimum"):
        kind = schema.get("type", "number")
        low = schema.get("minimum")
        return f"a{'n' if kind[0] in 'aeiou' else ''} {kind}" + (f" >= {low}" if low is not None else "")
    if error.validator == "required":
        return f"the keys {', '.join(schema.get('required', []))}"
    return "a role spec as in docs/resources.md (environment: resources, tensorflow: n_workers, n_ps, ...)"
