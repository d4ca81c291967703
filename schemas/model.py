"""Engine-neutral field and schema definitions."""

from __future__ import annotations

from dataclasses import dataclass

# The logical types a field may have; each engine module maps every one of them.
TYPES = ("string", "int", "long", "boolean", "double", "timestamp", "strings")  # strings: a list of strings


@dataclass(frozen=True)
class Field:
    name: str
    type: str
    nullable: bool = False
    doc: str = ""

    def __post_init__(self) -> None:
        if self.type not in TYPES:
            raise ValueError(f"field {self.name!r}: unknown type {self.type!r}; expected one of {TYPES}")


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
    def required(self) -> tuple[str, ...]:
        return tuple(f.name for f in self.fields if not f.nullable)

    def field(self, name: str) -> Field:
        for f in self.fields:
            if f.name == name:
                return f
        raise KeyError(f"schema {self.name!r} has no field {name!r}")
