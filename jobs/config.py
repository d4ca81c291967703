"""Layered YAML configuration loaded into frozen, validated dataclasses.

Layers, each over the previous: conf/base.yaml, the environment file (conf/<env>.yaml), a user's
--conf FILE, then command-line overrides. Every layer is checked on its own, so an error names the
file and the dotted key that is wrong.
"""

from __future__ import annotations

import dataclasses
import os
import re
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from jobs.errors import ConfigError
from schemas.quality import suite_names


def _conf_dir() -> Path:
    """TXN_RECON_CONF_DIR; else conf/ beside the packages (a checkout); else conf/ in the working folder
    (the packages imported from the spark-submit zip, which holds no YAML)."""
    if "TXN_RECON_CONF_DIR" in os.environ:
        return Path(os.environ["TXN_RECON_CONF_DIR"])
    beside = Path(__file__).resolve().parent.parent / "conf"
    return beside if beside.is_dir() else Path.cwd() / "conf"


CONF_DIR = _conf_dir()
JARS_DIR_VARIABLE = "TXN_RECON_JARS_DIR"  # the Delta jars' folder, over every layer
ENVIRONMENTS = ("local", "cluster")


@dataclass(frozen=True)
class SparkSettings:
    app_name: str
    master: str | None
    delta_jars: str
    jars_dir: Path
    delta_packages: tuple[str, ...]
    conf: Mapping[str, str]

    def __post_init__(self) -> None:
        if self.delta_jars not in ("local", "packages"):
            raise ConfigError(f"spark.delta_jars: expected 'local' or 'packages', got {self.delta_jars!r}")
        for coord in self.delta_packages:
            if not re.fullmatch(r"[\w.\-]+:[\w.\-]+:[\w.\-]+", coord):
                raise ConfigError(f"spark.delta_packages: {coord!r} is not a group:artifact:version coordinate")


@dataclass(frozen=True)
class BrokerSettings:
    """RocketMQ broker settings the rules depend on (reference/rocketmq.md §1.1)."""

    transaction_timeout_ms: int
    check_interval_ms: int
    check_max: int
    file_reserved_hours: int
    op_batch_interval_ms: int


@dataclass(frozen=True)
class Thresholds:
    stuck_after_ms: int
    op_grace_ms: int
    stranded_after_ms: int
    route_delay_ms: int
    idle_window_ms: int
    idle_min_messages: int


@dataclass(frozen=True)
class IngestSettings:
    batch_bytes: int  # new landing files are read in batches of about this many bytes
    archive: bool  # move each file, once recorded, to <landing>/_ingested/<run id>/ (`jobs.ingest.archive`)


@dataclass(frozen=True)
class QualitySettings:
    blocking: tuple[str, ...]  # suites whose failures make `txn-recon quality` exit non-zero

    def __post_init__(self) -> None:
        known = suite_names()
        unknown = [name for name in self.blocking if name not in known]
        if unknown:
            raise ConfigError(f"quality.blocking: unknown suite {unknown[0]!r}; expected some of {', '.join(known)}")


@dataclass(frozen=True)
class CollectSettings:
    """`txn-recon collect`: how it reads a live cluster (the access key and secret may also come from the
    environment, TXN_RECON_ACCESS_KEY and TXN_RECON_SECRET_KEY, which win)."""

    group: str  # the consumer group it pulls with; it never commits an offset through it
    topics: tuple[str, ...]  # business topics to read; none: every business topic of every broker
    trace_topics: tuple[str, ...]  # trace topics clients name, read besides RMQ_SYS_TRACE_TOPIC (export-store too)
    timeout_s: int  # every network call
    access_key: str | None
    secret_key: str | None

    def __post_init__(self) -> None:
        if not re.fullmatch(r"[%|a-zA-Z0-9_-]{1,255}", self.group) or self.group.startswith("CID_RMQ_SYS_"):
            raise ConfigError(f"collect.group: {self.group!r} is not a consumer group of our own (letters, digits, "
                              f"'_', '-'; not a broker group such as CID_RMQ_SYS_TRANS)")  # fmt: skip
        if (self.access_key is None) != (self.secret_key is None):
            raise ConfigError("collect.access_key and collect.secret_key: give both or neither")


@dataclass(frozen=True)
class ServeSettings:
    """`txn-recon serve`: the landing it watches, the cluster it may collect, and where it listens."""

    landing: str | None  # the command line's --landing wins
    namesrv: str | None  # HOST:PORT[;HOST:PORT]: collect each cycle; null: only what others land
    every_s: int  # seconds from one cycle's start to the next one's
    http: str  # HOST:PORT of /metrics, /healthz and the dashboard
    sql: str | None  # HOST:PORT of the SQL server (HiveServer2 protocol: JDBC, ODBC, beeline); null: none
    sql_unauthenticated: bool  # a non-loopback `sql` must say so: the SQL server asks for no password
    stale_after_cycles: int  # /healthz fails when the last good cycle is older than this many intervals
    compact_every_cycles: int | None  # every this many cycles, the tables' small files are joined; null: never

    def __post_init__(self) -> None:
        for name, address in (("http", self.http), ("sql", self.sql)):
            if address is not None and not re.fullmatch(r"\[?[\w.:-]+\]?:\d{1,5}", address):
                raise ConfigError(f"serve.{name}: {address!r} is not HOST:PORT")
        if self.sql is not None and not is_loopback(self.sql) and not self.sql_unauthenticated:
            raise ConfigError(f"serve.sql: {self.sql} is reachable from other hosts and the SQL server asks for no "
                              "password; bind it to 127.0.0.1, or set serve.sql_unauthenticated: true to say you "
                              "mean it")  # fmt: skip


def host_port(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host.strip("[]"), int(port)


def is_loopback(address: str) -> bool:
    host = host_port(address)[0]
    return host == "localhost" or host.startswith("127.") or host == "::1"


@dataclass(frozen=True)
class Config:
    warehouse: str  # a local folder (made absolute) or a URI such as s3a://bucket/path
    database: str
    spark: SparkSettings
    broker: BrokerSettings
    thresholds: Thresholds
    ingest: IngestSettings
    quality: QualitySettings
    collect: CollectSettings
    serve: ServeSettings

    def __post_init__(self) -> None:
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", self.database):
            raise ConfigError(f"database: {self.database!r} is not a valid database name")

    @property
    def is_local_warehouse(self) -> bool:
        return "://" not in self.warehouse

    def table(self, name: str) -> str:
        """The catalog name of one of the project's tables."""
        return f"{self.database}.{name}"

    def with_spark_conf(self, conf: Mapping[str, str]) -> Config:
        """This config with `conf` as its Spark settings."""
        return dataclasses.replace(self, spark=dataclasses.replace(self.spark, conf=dict(conf)))


def load_config(
    conf_file: str | Path | None = None,
    env: str | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> Config:
    """Merge the layers and build a validated Config; raises ConfigError naming the bad key."""
    env = env or os.environ.get("TXN_RECON_ENV", "local")
    if env not in ENVIRONMENTS:
        raise ConfigError(f"unknown environment {env!r}; expected one of {', '.join(ENVIRONMENTS)}")
    # A relative folder is taken from where it is written: conf/'s from the folder holding conf/ (the
    # checkout), a --conf file's from that file's folder, the command line's from the working folder. So a
    # job started from any folder (cron, a service) finds the same jars and warehouse as `make run`.
    layers = [(CONF_DIR / "base.yaml", CONF_DIR.parent), (CONF_DIR / f"{env}.yaml", CONF_DIR.parent)]
    if conf_file is not None:
        layers.append((Path(conf_file), Path(conf_file).absolute().parent))
    merged: dict[str, Any] = {}
    for path, base in layers:
        data = _read_yaml(path)
        _check_layer(data, Config, "", str(path))
        merged = _merge(merged, _anchored(data, base))
    command_line = dict(overrides or {})
    if JARS_DIR_VARIABLE in os.environ:
        command_line = _merge(command_line, {"spark": {"jars_dir": os.environ[JARS_DIR_VARIABLE]}})
    if command_line:
        _check_layer(command_line, Config, "", "command line")
        merged = _merge(merged, _anchored(command_line, Path.cwd()))
    return _build(Config, merged, "")


def _anchored(layer: dict[str, Any], base: Path) -> dict[str, Any]:
    """The layer with its relative folders (warehouse, spark.jars_dir, serve.landing) made absolute against
    `base`."""
    out = dict(layer)
    warehouse = out.get("warehouse")
    if isinstance(warehouse, str) and "://" not in warehouse:
        out["warehouse"] = str(base / Path(warehouse).expanduser())
    for section, key in (("spark", "jars_dir"), ("serve", "landing")):
        part = out.get(section)
        if isinstance(part, dict) and isinstance(part.get(key), str):
            out[section] = {**part, key: str(base / Path(part[key]).expanduser())}
    return out


def _read_yaml(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{path}: configuration file not found") from None
    except OSError as e:
        raise ConfigError(f"{path}: cannot read configuration file ({e.strerror})") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(e, "problem", None) or "invalid YAML"
        raise ConfigError(f"{path}: malformed YAML{where}: {problem}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping of settings at the top level")
    return data


def _merge(base: dict[str, Any], top: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in top.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = value
    return out


def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _check_layer(data: dict[str, Any], cls: type, prefix: str, source: str) -> None:
    """Reject unknown keys and values of the wrong shape in one (possibly partial) layer."""
    hints = _hints(cls)
    for key, value in data.items():
        dotted = f"{prefix}{key}"
        if key not in hints:
            known = ", ".join(sorted(hints))
            raise ConfigError(f"{source}: unknown key '{dotted}' (expected one of: {known})")
        hint = hints[key]
        if dataclasses.is_dataclass(hint):
            if not isinstance(value, dict):
                raise ConfigError(f"{source}: '{dotted}' must be a mapping, got {_kind(value)}")
            _check_layer(value, typing.cast(type, hint), dotted + ".", source)
        else:
            problem = _problem(hint, value)
            if problem:
                raise ConfigError(f"{source}: '{dotted}' {problem}")


def _problem(hint: Any, value: Any) -> str | None:
    """Why `value` cannot fill a field of type `hint`, or None if it can."""
    origin = typing.get_origin(hint)
    if origin in (types.UnionType, typing.Union):
        if value is None and type(None) in typing.get_args(hint):
            return None
        inner = [a for a in typing.get_args(hint) if a is not type(None)]
        return _problem(inner[0], value)
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            return f"must be a whole number, got {_kind(value)}"
        if value <= 0:
            return f"must be positive, got {value}"
        return None
    if hint is bool:
        return None if isinstance(value, bool) else f"must be true or false, got {_kind(value)}"
    if hint in (str, Path):
        if not isinstance(value, str) or not value.strip():
            return f"must be a non-empty string, got {_kind(value)}"
        return None
    if origin is tuple:
        if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
            return f"must be a list of strings, got {_kind(value)}"
        return None
    if origin is Mapping:
        if not isinstance(value, dict):
            return f"must be a mapping, got {_kind(value)}"
        for k, v in value.items():
            if not isinstance(v, (str, int, float, bool)):
                return f"has a non-scalar value for '{k}': {_kind(v)}"
        return None
    raise TypeError(f"unsupported config field type {hint!r}")  # a bug in this module, not user input


def _build(cls: type, data: dict[str, Any], prefix: str) -> Any:
    kwargs = {}
    for name, hint in _hints(cls).items():
        dotted = f"{prefix}{name}"
        if name not in data:
            raise ConfigError(f"configuration: missing key '{dotted}'")
        value = data[name]
        if dataclasses.is_dataclass(hint):
            kwargs[name] = _build(hint, value, dotted + ".")  # type: ignore[arg-type]
        elif hint is Path:
            kwargs[name] = Path(value).expanduser().absolute()
        elif name == "warehouse":
            kwargs[name] = value if "://" in value else str(Path(value).expanduser().absolute())
        elif typing.get_origin(hint) is tuple:
            kwargs[name] = tuple(value)
        elif typing.get_origin(hint) is Mapping:
            kwargs[name] = types.MappingProxyType({str(k): _conf_value(v) for k, v in value.items()})
        else:
            kwargs[name] = value
    return cls(**kwargs)


def _conf_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _kind(value: Any) -> str:
    return "nothing" if value is None else f"{type(value).__name__} {value!r}"
