"""Engine-neutral field and schema definitions."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

# The logical types a field may have; each engine module maps every one of them.
TYPES = ("string", "int", "long", "boolean", "double", "timestamp", "strings")  # strings: a list of strings


@dataclass(frozen=True)
class Field:
    name: str
    type: str
    nullable: bool = False
    doc: str = ""
    # A nullable field some records still need: (field, value) pairs, any of which makes it required;
    # value None means that field is null or absent.
    required_when: tuple[tuple[str, str | None], ...] = ()
    # What an absent value means, for a field added to a stream after its first landing files: stored as
    # this value (so it can be part of a key), hashed as absent (so an old record still repeats itself).
    default: str | None = None

    def __post_init__(self) -> None:
        if self.type not in TYPES:
            raise ValueError(f"field {self.name!r}: unknown type {self.type!r}; expected one of {TYPES}")
        if self.required_when and not self.nullable:
            raise ValueError(f"field {self.name!r}: required_when only makes sense on a nullable field")
        if self.default is not None and not self.nullable:
            raise ValueError(f"field {self.name!r}: a default only makes sense on a nullable field")

    def required_in(self, record: Mapping[str, Any]) -> bool:
        """Whether `record` must give this field."""
        return not self.nullable or any(record.get(k) == v for k, v in self.required_when)

    @property
    def required_when_text(self) -> str:
        """The condition in words, for error messages and docs."""
        return " or ".join(f"{k} is {'null' if v is None else v}" for k, v in self.required_when)


@dataclass(frozen=True)
class Schema:
    """An ordered set of fields; `key` names the natural key columns, if any."""

    name: str
    fields: tuple[Field, ...]
    key: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        names = [f.name for f in self.fields]
        if len(set(names)) != len(names):
            raise ValueError(f"schema {self.name!r}: duplicate field names")
        missing = [k for k in self.key if k not in names]
        if missing:
            raise ValueError(f"schema {self.name!r}: key columns {missing} are not fields")

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(f.name for f in self.fields)

    @property
    def defaults(self) -> dict[str, str]:
        return {f.name: f.default for f in self.fields if f.default is not None}

    @property
    def required(self) -> tuple[str, ...]:
        return tuple(f.name for f in self.fields if not f.nullable)

    def field(self, name: str) -> Field:
        for f in self.fields:
            if f.name == name:
                return f
        raise KeyError(f"schema {self.name!r} has no field {name!r}")
