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

It is accepted wherever a resource file is (:func:`parallax.resources.parse_resource_text`
tells it by its first line): on one machine every task runs on ``localhost``,
worker ``k`` on the next GPUs in turn (one CPU replica without GPUs), each ps as a
parameter server; ``parallax manifest`` turns the same spec into what a cluster
manager runs. The spec may be the section itself or a whole polyaxonfile (only its
``environment`` is read). It is checked against a JSON Schema (:data:`SCHEMA`,
with ``jsonschema``); an error names the file, the line and the key.

``request``/``limit`` are read as ``requests``/``limits`` (the seed's own example
writes ``gpu: {request: 1}``). A worker without resources of its own or a
``default_worker`` has the master's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from parallax.errors import ResourceFileError
from parallax.resources import Cluster, Device, ServerTask, WorkerTask

__all__ = ["Resources", "RoleTask", "RoleSpec", "SCHEMA", "looks_like_role_spec", "parse_role_spec"]

_FIRST_KEYS = ("environment:", "tensorflow:", "resources:", "version:", "kind:")
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
_ENVIRONMENT = {"type": "object", "properties": {"resources": _RESOURCES, "tensorflow": _TENSORFLOW},
                "not": {"anyOf": [{"required": [k]} for k in ("mxnet", "pytorch", "horovod")]}}
#: The JSON Schema a role spec is checked against: the section itself, or a polyaxonfile holding it.
SCHEMA = {"$schema": "https://json-schema.org/draft/2020-12/schema",
          "oneOf": [{"type": "object", "required": ["environment"], "properties": {"environment": _ENVIRONMENT}},
                    {"allOf": [_ENVIRONMENT, {"not": {"required": ["environment"]}}]}]}


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
    """One task: ``role`` is ``master``, ``worker`` or ``ps``; ``line`` where the spec defines it."""

    role: str
    index: int
    resources: Resources
    line: int


@dataclass(frozen=True)
class RoleSpec:
    """Every task of a role spec, the master first, then the workers, then the ps tasks."""

    tasks: tuple[RoleTask, ...]
    source: str
    text: str

    def of(self, role: str) -> tuple[RoleTask, ...]:
        return tuple(t for t in self.tasks if t.role == role)

    def cluster(self, host: str = "localhost") -> Cluster:
        """The spec's tasks on one machine: the master and the workers, each on the next GPUs in turn
        (one CPU replica without GPUs), and the ps tasks as parameter servers."""
        workers, gpu = [], 0
        for t in self.tasks:
            if t.role == "ps":
                continue
            n = t.resources.gpus
            devices = tuple(Device("gpu", gpu + i) for i in range(n)) if n else (Device("cpu", 0),)
            gpu += n
            workers.append(WorkerTask(host, devices, None, t.line))
        servers = tuple(ServerTask(host, None, t.line) for t in self.of("ps"))
        return Cluster(tuple(workers), servers, self.source, explicit_roles=True, text=self.text)


def looks_like_role_spec(text: str) -> bool:
    """Whether ``text``'s first meaningful line starts a role spec (``environment:``, ``tensorflow:``, ...)."""
    for raw in text.splitlines():
        line = raw.split("#", 1)[0].rstrip()
        if line.strip():
            return line.startswith(_FIRST_KEYS)
    return False


def parse_role_spec(text: str, source: str = "<role spec>") -> RoleSpec:
    """Parse and check a role spec.

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
    validator = jsonschema.Draft202012Validator(SCHEMA)
    errors = sorted(validator.iter_errors(data), key=lambda e: -len(e.absolute_path))
    if errors:
        raise _schema_error(source, root, data, errors)
    environment = data.get("environment", data)
    tensorflow = environment.get("tensorflow") or {}
    line = _line_of(root, ["environment"] if "environment" in data else [])
    master = Resources.from_dict(environment.get("resources"))
    tasks = [RoleTask("master", 0, master, _line_of(root, _path(data, "resources")) or line)]
    for role, default_role in (("worker", "default_worker"), ("ps", "default_ps")):
        count = tensorflow.get(f"n_{role}s" if role == "worker" else "n_ps", 0)
        default = (tensorflow.get(default_role) or {}).get("resources")
        overrides = {}
        for i, entry in enumerate(tensorflow.get(role) or []):
            where = _line_of(root, [*_path(data, "tensorflow"), role, i])
            if entry["index"] >= count:
                raise ResourceFileError(f"{source}, line {where}: tensorflow.{role}[{i}] has index {entry['index']}, "
                                        f"but n_{'workers' if role == 'worker' else 'ps'} is {count}. Expected an "
                                        f"index from 0 to {count - 1}")
            overrides[entry["index"]] = (entry.get("resources"), where)
        count_line = _line_of(root, [*_path(data, "tensorflow"), f"n_{role}s" if role == "worker" else "n_ps"])
        for index in range(count):
            resources, where = overrides.get(index, (None, count_line))
            if resources is None:
                resources = default
            chosen = Resources.from_dict(resources) if resources is not None else \
                (master if role == "worker" else Resources())
            tasks.append(RoleTask(role, index, chosen, where or line))
    return RoleSpec(tuple(tasks), source, text)


def _path(data: dict, key: str) -> list:
    return ["environment", key] if "environment" in data else [key]


def _node_at(root: Any, path: list) -> Any:
    """The YAML node at ``path`` (keys and list indexes) of the composed document, or ``None``."""
    import yaml

    node = root
    for key in path:
        if isinstance(node, yaml.MappingNode):
            node = next((v for k, v in node.value if k.value == key), None)
        elif isinstance(node, yaml.SequenceNode) and isinstance(key, int) and key < len(node.value):
            node = node.value[key]
        else:
            return node  # below a scalar (or a missing key): the nearest node there is
    return node


def _line_of(root: Any, path: list) -> int:
    node = _node_at(root, path)
    return node.start_mark.line + 1 if node is not None else 0


def _schema_error(source: str, root: Any, data: Any, errors: list) -> ResourceFileError:
    error = errors[0]
    # oneOf over the two shapes: the error of the shape the document has is the telling one
    if error.validator == "oneOf" and error.context:
        shape = 0 if isinstance(data, dict) and "environment" in data else 1
        inner = [e for e in error.context if e.schema_path and e.schema_path[0] == shape] or list(error.context)
        error = sorted(inner, key=lambda e: -len(e.absolute_path))[0]
    path = list(error.absolute_path)
    line = _line_of(root, path)
    key = ".".join(str(p) if not isinstance(p, int) else f"[{p}]" for p in path).replace(".[", "[") or "the top level"
    if error.validator == "additionalProperties":
        extra = sorted(set(error.instance) - set(error.schema.get("properties", {})))
        node_line = _line_of(root, [*path, extra[0]]) if extra else line
        known = ", ".join(error.schema.get("properties", {}))
        return ResourceFileError(f"{source}, line {node_line}: {key} has the key \"{extra[0] if extra else '?'}\"; "
                                 f"expected one of: {known}")
    if error.validator == "not":
        return ResourceFileError(f"{source}, line {line}: {key} describes another framework (mxnet, pytorch or "
                                 "horovod); expected a tensorflow section")
    return ResourceFileError(f"{source}, line {line}: {key} {error.message}; expected "
                             f"{_expected(error)}")


def _expected(error: Any) -> str:
    schema = error.schema
    if error.validator in ("type", "minimum"):
        kind = schema.get("type", "number")
        low = schema.get("minimum")
        return f"a{'n' if kind[0] in 'aeiou' else ''} {kind}" + (f" >= {low}" if low is not None else "")
    if error.validator == "required":
        return f"the keys {', '.join(schema.get('required', []))}"
    return "a role spec as in docs/resources.md (environment: resources, tensorflow: n_workers, n_ps, ...)"
