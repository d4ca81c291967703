"""A real RocketMQ name server and broker on loopback, from the jars `make rocketmq` fetched, and the
scenario driver (Scenario.java, the official Java client) compiled against them.

Each server runs with a small heap and its own `user.home` and `rocketmq.home.dir` under a temporary
folder (its logs land there), on free ports. `start` waits until the name server has registered the
broker; `stop` ends both, and `RocketMQ` is a context manager so a failing test stops them too.
"""

from __future__ import annotations

import os
import random
import re
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
JARS_ROOT = REPO / ".jars" / "rocketmq"
# The suite's main version (the POM's): its broker runs every real-broker test, its client drives them all.
VERSION = re.search(r"<rocketmq.version>(.+?)</", (Path(__file__).parent / "pom.xml").read_text()).group(1)  # type: ignore[union-attr]
# Every version `make rocketmq` fetched for this run (ROCKETMQ_VERSIONS), the main one first.
VERSIONS = tuple(dict.fromkeys([VERSION, *os.environ.get("ROCKETMQ_VERSIONS", VERSION).split()]))
JVM = ["-Xms64m", "-Xmx256m", "-XX:MaxDirectMemorySize=256m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1"]
START_TIMEOUT_S = 90
# A 4.x broker reaches into java.nio internals that JDK 17 closes, and configures logback from its home.
JVM_4X = ["--add-opens", "java.base/java.nio=ALL-UNNAMED", "--add-opens", "java.base/sun.nio.ch=ALL-UNNAMED"]
LOGBACK_4X = """<configuration>
  <appender name="FILE" class="ch.qos.logback.core.FileAppender">
    <file>${{user.home}}/logs/rocketmqlogs/{name}.log</file>
    <encoder><pattern>%d{{HH:mm:ss.SSS}} %-5level %logger{{0}} - %msg%n</pattern></encoder>
  </appender>
  <root level="INFO"><appender-ref ref="FILE"/></root>
</configuration>
"""


def classpath(version: str = VERSION) -> str:
    return f"{JARS_ROOT / version}/*"


def is_4x(version: str) -> bool:
    return version.startswith("4.")


@dataclass(frozen=True)
class BrokerSettings:
    """The transaction knobs of reference §5.3, fast enough for a test, and the store's layout."""

    check_interval_ms: int = 2000
    transaction_timeout_ms: int = 1000
    check_max: int = 3
    op_batch_interval_ms: int = 3000
    commitlog_file_bytes: int = 64 * 1024  # small files: exports cross file boundaries


def require_jars(version: str = VERSION) -> None:
    if not (JARS_ROOT / version / f"rocketmq-broker-{version}.jar").is_file():
        raise RuntimeError(f"RocketMQ {version} jars missing from {JARS_ROOT / version}: run `make rocketmq` "
                           "(part of `make test`)")  # fmt: skip


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


# Ports below the kernel's ephemeral range (32768-60999 here), which it never hands out as the local port of
# an outgoing connection: a port picked from that range could be taken by another test's client before the
# broker binds it (seen once for the HA port: `BindException` in DefaultHAService).
PORTS = range(20_000, 32_000)


def free_broker_port() -> int:
    """A listen port whose fast port (-2) and HA port (+1) are free too."""
    for _ in range(200):
        port = random.choice(PORTS)
        if all(_port_free(p) for p in (port - 2, port, port + 1)):
            return port
    raise RuntimeError("no free port triple for the broker")


# Seconds pass between finding a broker's ports free and its binding them. Even in that range, a full suite
# run on 3 December 2026 saw its HA port taken in between: a first start then tries other ports.
PORT_TRIES = 3


class PortTaken(RuntimeError):
    """A process of ours exited because a port it was given was taken."""

    def __init__(self, name: str, message: str) -> None:
        super().__init__(message)
        self.name = name


def free_port() -> int:
    for _ in range(200):
        port = random.choice(PORTS)
        if _port_free(port):
            return port
    raise RuntimeError("no free port for the name server")


def compile_driver(out: Path) -> Path:
    """Scenario.java compiled against the client jars; returns the class folder."""
    require_jars()
    out.mkdir(parents=True, exist_ok=True)
    source = Path(__file__).parent / "Scenario.java"
    subprocess.run(["javac", "-nowarn", "-d", str(out), "-cp", classpath(), str(source)],
                   check=True, capture_output=True, text=True)  # fmt: skip
    return out


@dataclass
class RocketMQ:
    root: Path
    settings: BrokerSettings = field(default_factory=BrokerSettings)
    broker_name: str = "broker-a"
    namesrv_port: int = field(default_factory=free_port)
    broker_port: int = field(default_factory=free_broker_port)
    acl: tuple[str, str] | None = None  # an access key and secret: the broker authenticates every request
    version: str = VERSION  # the name server's and broker's (the client is always the main version's)
    extra_conf: tuple[str, ...] = ()  # more broker.conf lines, `key=value`
    # A broker joining another's cluster: that one's name server home (start this one with `start_broker`).
    namesrv_home: Path | None = None
    processes: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    started: bool = field(default=False, init=False)  # once started, a restart keeps its ports: clients know them

    @property
    def namesrv(self) -> str:
        return f"127.0.0.1:{self.namesrv_port}"

    @property
    def store(self) -> Path:
        return self.root / "store"

    def home(self, name: str) -> Path:
        return self.root / "home" / name

    def _spawn(self, name: str, main_class: str, conf: str) -> None:
        home = self.home(name)
        home.mkdir(parents=True, exist_ok=True)
        (home / f"{name}.conf").write_text(conf)
        jvm = JVM
        if is_4x(self.version):
            jvm = [*JVM, *JVM_4X]
            (home / "conf").mkdir(exist_ok=True)
            (home / "conf" / f"logback_{name}.xml").write_text(LOGBACK_4X.format(name=name))
        cmd = ["java", *jvm, f"-Drocketmq.home.dir={home}", f"-Duser.home={home}", "-cp", classpath(self.version),
               main_class, "-c", str(home / f"{name}.conf")]  # fmt: skip
        log = open(home / "console.log", "wb")  # noqa: SIM115 (the child keeps it)
        self.processes[name] = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        log.close()

    def broker_conf(self) -> str:
        s, store = self.settings, self.store
        return "\n".join([
            "brokerClusterName=DefaultCluster", f"brokerName={self.broker_name}", "brokerId=0",
            "brokerRole=ASYNC_MASTER", "flushDiskType=ASYNC_FLUSH", f"namesrvAddr={self.namesrv}",
            "brokerIP1=127.0.0.1", f"listenPort={self.broker_port}", f"storePathRootDir={store}",
            f"storePathCommitLog={store / 'commitlog'}", f"mappedFileSizeCommitLog={s.commitlog_file_bytes}",
            f"transactionCheckInterval={s.check_interval_ms}", f"transactionTimeOut={s.transaction_timeout_ms}",
            f"transactionCheckMax={s.check_max}", f"transactionOpBatchInterval={s.op_batch_interval_ms}",
            "flushConsumerOffsetInterval=1000", "autoCreateTopicEnable=true", "autoCreateSubscriptionGroup=true",
            "timerWheelEnable=false", *self._auth_conf(), *self.extra_conf, "",
        ])  # fmt: skip

    def _auth_conf(self) -> list[str]:
        """ACL 2.0, the only ACL a 5.3 broker has (`aclEnable` is read by nothing). Its users come from a
        plain ACL 1.0 file (conf/plain_acl.yml), which the broker migrates at start (AuthMigrator)."""
        if self.acl is None:
            return []
        provider = "org.apache.rocketmq.auth.{0}.provider.Local{1}MetadataProvider"
        return ["authenticationEnabled=true",
                "authenticationProvider=org.apache.rocketmq.auth.authentication.provider.DefaultAuthenticationProvider",
                f"authenticationMetadataProvider={provider.format('authentication', 'Authentication')}",
                f"authorizationMetadataProvider={provider.format('authorization', 'Authorization')}",
                "migrateAuthFromV1Enabled=true"]  # fmt: skip

    def _write_plain_acl(self) -> None:
        if self.acl is None:
            return
        conf = self.home("broker") / "conf"
        conf.mkdir(parents=True, exist_ok=True)
        access, secret = self.acl
        (conf / "plain_acl.yml").write_text(
            f"accounts:\n  - accessKey: {access}\n    secretKey: {secret}\n    admin: true\n"
        )

    def start(self) -> RocketMQ:
        """The name server, then the broker. A start that fails stops what it started: `with` calls no
        `__exit__` when `__enter__` raises (a name server outlived the suite run whose broker could not bind)."""
        require_jars(self.version)
        try:
            self._spawn("namesrv", "org.apache.rocketmq.namesrv.NamesrvStartup", f"listenPort={self.namesrv_port}\n")
            self._wait(lambda: not _port_free(self.namesrv_port), "the name server to listen")
            self.start_broker()
        except BaseException:
            self.stop()
            raise
        return self

    def start_broker(self) -> None:
        """The broker alone (again, after `kill_broker`: same store, same ports). A first start whose ports
        another process bound after they were found free starts again on others."""
        self._write_plain_acl()
        for attempt in range(1 if self.started else PORT_TRIES):

            def registered(before: int = self._registrations()) -> bool:
                return self._registrations() > before

            self._spawn("broker", "org.apache.rocketmq.broker.BrokerStartup", self.broker_conf())
            try:
                self._wait(registered, "the broker to register with the name server")
                break
            except PortTaken as e:
                if self.started or e.name != "broker" or attempt == PORT_TRIES - 1:
                    raise
                self.broker_port = free_broker_port()
        self.started = True

    def _registrations(self) -> int:
        logs = (self.namesrv_home or self.home("namesrv")) / "logs" / "rocketmqlogs"
        return sum(p.read_text(errors="replace").count("new broker registered") for p in logs.glob("*.log"))

    def _wait(self, ready: Callable[[], bool], what: str) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            for name, p in self.processes.items():
                if p.poll() is not None:
                    tail = (self.home(name) / "console.log").read_text(errors="replace")[-2000:]
                    message = f"the {name} exited with {p.returncode} while waiting for {what}:\n{tail}"
                    raise PortTaken(name, message) if "java.net.BindException" in tail else RuntimeError(message)
            if ready():
                return
            time.sleep(0.2)
        raise RuntimeError(f"timed out after {START_TIMEOUT_S} s waiting for {what}")

    def kill_broker(self) -> None:
        """SIGKILL: the store stays exactly as it is now (a graceful stop would run more check passes)."""
        self._stop("broker", signal.SIGKILL)

    def _stop(self, name: str, sig: int) -> None:
        p = self.processes.pop(name, None)
        if p is None or p.poll() is not None:
            return
        os.killpg(p.pid, sig)
        try:
            p.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()

    def stop(self) -> None:
        for name in ("broker", "namesrv"):
            self._stop(name, signal.SIGTERM)

    def log(self, name: str, file: str) -> str:
        path = self.home(name) / "logs" / "rocketmqlogs" / file
        return path.read_text(errors="replace") if path.exists() else ""

    def __enter__(self) -> RocketMQ:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def mqadmin(namesrv: str, command: str, *args: str, home: Path) -> str:
    """RocketMQ's own admin tool (`mqadmin COMMAND -n NAMESRV ARGS`), from the fetched jars; its output."""
    home.mkdir(parents=True, exist_ok=True)
    cmd = ["java", "-Xmx128m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", f"-Duser.home={home}",
           f"-Drocketmq.home.dir={home}", "-cp", classpath(), "org.apache.rocketmq.tools.command.MQAdminStartup",
           command, "-n", namesrv, *args]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    if done.returncode != 0 or "Exception" in done.stdout:
        raise RuntimeError(f"mqadmin {command} failed ({done.returncode}):\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
    return done.stdout


def wait_for(ready: Callable[[], bool], what: str, timeout_s: float = 60) -> None:
    """Poll `ready` until it holds; an AssertionError naming `what` after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while not ready():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


def _driver(classes: Path, phase: str, namesrv: str, out: Path, args: tuple[str, ...], home: Path,
            acl: tuple[str, str] | None, trace: bool = False) -> list[str]:  # fmt: skip
    home.mkdir(parents=True, exist_ok=True)
    keys = [f"-Dacl.accessKey={acl[0]}", f"-Dacl.secretKey={acl[1]}"] if acl else []
    keys += ["-Dtrace=true"] if trace else []
    return ["java", "-Xmx256m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", f"-Duser.home={home}", *keys,
            "-cp", f"{classes}:{classpath()}", "Scenario", phase, namesrv, str(out), *args]  # fmt: skip


def run_driver(classes: Path, phase: str, namesrv: str, out: Path, *args: str, home: Path,
               timeout_s: int = 180, acl: tuple[str, str] | None = None, trace: bool = False) -> None:  # fmt: skip
    """One phase of Scenario.java; its truth lines are appended to `out`. With `acl`, its clients sign; with
    `trace`, they trace (enableMsgTrace)."""
    cmd = _driver(classes, phase, namesrv, out, args, home, acl, trace)
    with open(home / f"driver-{phase}.log", "wb") as log:
        subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, check=True, timeout=timeout_s)


def start_driver(classes: Path, phase: str, namesrv: str, out: Path, *args: str, home: Path,
                 name: str, trace: bool = False) -> subprocess.Popen[bytes]:  # fmt: skip
    """A phase that runs until stopped (a consumer group member), in the background; `out` is its own file.

    Its stdin is a pipe: a member takes commands there, and ends when it closes.
    """
    cmd = _driver(classes, phase, namesrv, out, args, home, None, trace)
    with open(home / f"driver-{name}.log", "wb") as log:
        return subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=log, stderr=subprocess.STDOUT)
