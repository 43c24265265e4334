"""The config record every config class is: a field's default and checker written once (:func:`_field`), and
every assignment checked (:class:`_ConfigBase`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import field
from dataclasses import fields as fields_of
from typing import Any


def _field(default: Any, check: Callable[[str, str, Any], Any], factory: bool = False) -> Any:
    """A config field: its default (written here once) and the checker every assignment runs."""
    if factory:
        return field(default_factory=default, metadata={"check": check})
    return field(default=default, metadata={"check": check})


class _ConfigBase:
    """Attribute-checked config object.

    Subclasses are dataclasses whose fields come from :func:`_field`: the
    default is written once, in the field, and the signature, ``repr`` and
    ``==`` follow from it. Every assignment (the constructor's too) runs the
    field's checker, so a bad value is reported where it is set, not deep
    inside a run.
    """

    def __setattr__(self, name: str, value: Any) -> None:
        fields = self.__dataclass_fields__  # type: ignore[attr-defined]
        if name not in fields:
            allowed = ", ".join(fields)
            raise AttributeError(f"{type(self).__name__} has no field {name!r}; its fields are: {allowed}")
        checker = fields[name].metadata["check"]
        object.__setattr__(self, name, checker(type(self).__name__, name, value))

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Check rules that involve more than one field. Raises ValueError."""

    def to_dict(self) -> dict[str, Any]:
        """Plain-data view (nested configs become dicts), for logs and the launcher."""
        out: dict[str, Any] = {}
        for f in fields_of(self):
            value = getattr(self, f.name)
            if isinstance(value, _ConfigBase):
                value = value.to_dict()
            elif f.name == "sess_config" and value is not None:
                value = str(value)
            out[f.name] = value
        return out
