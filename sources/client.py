"""A read-only remoting client of a RocketMQ cluster: the name server's cluster table, a broker's topics
and consumer offsets, and pulls. Every socket call has a timeout. The requests are those RocketMQ's own
tools send (apache/rocketmq 5.3.3):

- GET_BROKER_CLUSTER_INFO to a name server: `MQClientAPIImpl.getBrokerClusterInfo` (`mqadmin clusterList`).
- GET_ROUTEINFO_BY_TOPIC to a name server: `MQClientAPIImpl.getTopicRouteInfoFromNameServer`, how a
  producer learns which brokers take a topic (`mqadmin topicRoute`).
- GET_ALL_TOPIC_CONFIG to a broker: `MQClientAPIImpl.getAllTopicConfig` (`mqadmin topicList`'s broker
  view); it lists the system topics too, which the name server's topic list may not.
- GET_ALL_CONSUMER_OFFSET to a broker: `BrokerOuterAPI.getAllConsumerOffset`, how a slave copies its
  master's offset table; the answer is the table `consumerOffset.json` holds, every group's, including
  the check service's own `CID_RMQ_SYS_TRANS`.
- GET_CONSUMER_CONNECTION_LIST and GET_CONSUMER_RUNNING_INFO to a broker: `mqadmin consumerConnection` and
  `mqadmin consumerStatus` (`MQClientAPIImpl.getConsumerConnectionList`, `getConsumerRunningInfo`): a
  group's live members with the one subscription table the broker keeps for it, and each member's own
  subscriptions and held queues (the broker forwards the second request to the client).
- PULL_MESSAGE: `MQClientAPIImpl.pullMessage`, as `mqadmin printMsg` reads any topic with a pull consumer.
  The broker checks the topic's read permission, not whether it is a system topic
  (`PullMessageProcessor.processRequest`), so the transaction topics can be pulled this way; 5.x gRPC
  proxies refuse them, hence remoting.
- QUERY_CONSUME_QUEUE and VIEW_MESSAGE_BY_ID: `mqadmin queryCq` and `mqadmin queryMsgByOffset`, for a queue
  a pull is refused on: 4.x creates no topic config for its op topic (only `fetchMessageQueues`, which its
  check service calls for the half topic alone, creates one), so its pull answers TOPIC_NOT_EXIST while the
  store holds the queue (seen on a 4.9.7 broker).
"""

from __future__ import annotations

import contextlib
import json
import socket
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from sources import remoting
from sources.fastjson import FastjsonError, loads
from sources.remoting import Command, Credentials, ProtocolError

# PullSysFlag: FLAG_SUBSCRIPTION only. Never FLAG_COMMIT_OFFSET: the collector commits nothing. No
# FLAG_SUSPEND either: the broker answers PULL_NOT_FOUND at once instead of holding the request.
PULL_SYS_FLAG = 0x4
PULL_BATCH = 32  # maxMsgNums; the broker caps it at maxTransferCountOnMessageInMemory (32 by default)


class RemotingError(Exception):
    """A server could not be reached or answered with something we cannot read. One line, with the address."""


class Refused(RemotingError):
    """The server answered with an error code (e.g. an ACL refusal)."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class PullResult:
    code: int
    next_offset: int | None
    min_offset: int | None
    max_offset: int | None
    body: bytes
    remark: str | None

    @property
    def reason(self) -> str:
        return f"code {self.code}: {first_line(self.remark)}"


def first_line(remark: str | None) -> str:
    """A broker's remark in one line (some go on with a line pointing to the FAQ)."""
    return (remark or "").strip().split("\n", 1)[0] or "no reason given"


class Connection:
    """One TCP connection to a name server or broker. Requests may be pipelined: `send` several, then
    `receive` their answers, matched by opaque."""

    def __init__(self, address: str, timeout_s: float, creds: Credentials | None = None) -> None:
        self.address, self.creds = address, creds
        host, _, port = address.rpartition(":")
        self._opaque = 0
        self._early: dict[int, Command] = {}
        try:
            self._sock = socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s)
        except (OSError, ValueError) as e:
            raise RemotingError(f"{address}: cannot connect ({_reason(e)})") from None
        self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._file = self._sock.makefile("rb")

    def __enter__(self) -> Connection:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._file.close()
        self._sock.close()

    def send(self, code: int, fields: Mapping[str, Any] | None = None, body: bytes = b"") -> int:
        self._opaque += 1
        try:
            self._sock.sendall(remoting.encode(code, self._opaque, fields or {}, body, self.creds))
        except OSError as e:
            raise RemotingError(f"{self.address}: send failed ({_reason(e)})") from None
        return self._opaque

    def receive(self, opaque: int) -> Command:
        """The answer to the request `opaque`; answers to other requests are kept for their turn."""
        while opaque not in self._early:
            cmd = self._read()
            if cmd.is_response:  # a server's own requests (none are expected) are ignored
                self._early[cmd.opaque] = cmd
        return self._early.pop(opaque)

    def call(self, code: int, fields: Mapping[str, Any] | None = None, body: bytes = b"") -> Command:
        return self.receive(self.send(code, fields, body))

    def _read(self) -> Command:
        try:
            prefix = self._file.read(4)
            if len(prefix) < 4:
                raise RemotingError(f"{self.address}: the connection was closed")
            length = remoting.frame_length(prefix)
            frame = self._file.read(length)
            if len(frame) < length:
                raise RemotingError(f"{self.address}: the connection was closed mid-answer")
            return remoting.decode(frame)
        except TimeoutError:
            raise RemotingError(f"{self.address}: no answer within {self._sock.gettimeout():g} s") from None
        except OSError as e:
            raise RemotingError(f"{self.address}: receive failed ({_reason(e)})") from None
        except ProtocolError as e:
            raise RemotingError(f"{self.address}: not a RocketMQ answer ({e})") from None


def _reason(e: Exception) -> str:
    return getattr(e, "strerror", None) or str(e) or type(e).__name__


def _ok(conn: Connection, answer: Command, what: str) -> Command:
    if answer.code != remoting.SUCCESS:
        reason = first_line(answer.remark)
        hint = (
            " (ACL: check the access key and secret, and the user's rights)"
            if answer.code == remoting.NO_PERMISSION
            else ""
        )
        raise Refused(f"{conn.address} refused {what}: code {answer.code}: {reason}{hint}", answer.code)
    return answer


def _json(conn: Connection, answer: Command, what: str) -> Any:
    try:
        return loads(answer.body.decode("utf-8"))
    except (UnicodeDecodeError, FastjsonError) as e:
        raise RemotingError(f"{conn.address}: unreadable {what} ({e})") from None


@contextlib.contextmanager
def _shaped(address: str, what: str) -> Iterator[None]:
    """An answer that is JSON, but not shaped as RocketMQ writes it (a field missing, of another type), is as
    unreadable as one that is not JSON: a RemotingError naming it, never another exception."""
    try:
        yield
    except (KeyError, IndexError, TypeError, ValueError, AttributeError) as e:
        raise RemotingError(f"{address}: unreadable {what} ({type(e).__name__}: {e})") from None


def _text(value: Any) -> str:
    if not isinstance(value, str):
        raise TypeError(f"{value!r} is not text")
    return value


def _optional_text(value: Any) -> str | None:
    return None if value is None else _text(value)


def master_brokers(conn: Connection) -> dict[str, tuple[str, str]]:
    """brokerName -> (the master's address (brokerId 0), its cluster), from the name server's cluster table
    (ClusterInfo.brokerAddrTable). A broker without a master (it is down, or failing over) is left out."""
    answer = _ok(conn, conn.call(remoting.GET_BROKER_CLUSTER_INFO), "its cluster table")
    doc = _json(conn, answer, "cluster table")
    with _shaped(conn.address, "cluster table"):
        table = doc.get("brokerAddrTable") or {}
        return {_text(name): (_text(data["brokerAddrs"]["0"]), _text(data.get("cluster", "")))
                for name, data in table.items() if "0" in (data.get("brokerAddrs") or {})}  # fmt: skip


@dataclass(frozen=True, order=True)
class Member:
    """A broker of a cluster as the name server's cluster table lists it."""

    cluster: str
    broker_name: str
    broker_id: int  # 0: the master
    address: str


def cluster_members(conn: Connection) -> list[Member]:
    """Every broker the name server lists, masters and slaves, with its cluster (ClusterInfo.brokerAddrTable)."""
    answer = _ok(conn, conn.call(remoting.GET_BROKER_CLUSTER_INFO), "its cluster table")
    doc = _json(conn, answer, "cluster table")
    with _shaped(conn.address, "cluster table"):
        table = doc.get("brokerAddrTable") or {}
        return sorted(
            Member(_text(data.get("cluster", "")), _text(name), int(i), _text(address))
            for name, data in table.items()
            for i, address in (data.get("brokerAddrs") or {}).items()
        )


@dataclass(frozen=True)
class Queues:
    """A topic's queues on one broker: in its topic table (TopicConfig) or in a route (QueueData)."""

    read: int
    write: int
    perm: int  # PermName: 2 write, 4 read, 1 inherit (a topic the broker made itself)


def _queues(cfg: Any) -> Queues:
    return Queues(int(cfg["readQueueNums"]), int(cfg["writeQueueNums"]), int(cfg["perm"]))


def topic_table(conn: Connection) -> tuple[int | None, dict[str, Queues]]:
    """The broker's topic table: when it last changed (its dataVersion timestamp) and every topic's queues."""
    answer = _ok(conn, conn.call(remoting.GET_ALL_TOPIC_CONFIG), "its topic list")
    doc = _json(conn, answer, "topic list")
    with _shaped(conn.address, "topic list"):
        stamp = (doc.get("dataVersion") or {}).get("timestamp")
        table = doc.get("topicConfigTable") or {}
        return (None if stamp is None else int(stamp)), {_text(t): _queues(cfg) for t, cfg in table.items()}


def topic_route(conn: Connection, topic: str) -> dict[str, tuple[str | None, Queues]] | None:
    """brokerName -> (its cluster, its queues) in the topic's route, or None when the name server has none."""
    answer = conn.call(remoting.GET_ROUTEINFO_BY_TOPIC, {"topic": topic})
    if answer.code == remoting.TOPIC_NOT_EXIST:
        return None
    doc = _json(conn, _ok(conn, answer, f"the route of {topic}"), f"route of {topic}")
    with _shaped(conn.address, f"route of {topic}"):
        clusters = {_text(b["brokerName"]): _optional_text(b.get("cluster")) for b in doc.get("brokerDatas") or []}
        return {(name := _text(q["brokerName"])): (clusters.get(name), _queues(q)) for q in doc.get("queueDatas") or []}


def topic_queues(conn: Connection) -> dict[str, int]:
    """topic -> its read queue count on this broker (TopicConfigSerializeWrapper.topicConfigTable)."""
    answer = _ok(conn, conn.call(remoting.GET_ALL_TOPIC_CONFIG), "its topic list")
    doc = _json(conn, answer, "topic list")
    with _shaped(conn.address, "topic list"):
        table = doc.get("topicConfigTable") or {}
        return {_text(topic): int(cfg.get("readQueueNums", 0)) for topic, cfg in table.items()}


def consumer_offsets(conn: Connection) -> str:
    """The broker's consumer-offset table as text, the format of `consumerOffset.json`."""
    return _ok(conn, conn.call(remoting.GET_ALL_CONSUMER_OFFSET), "its consumer offsets").body.decode("utf-8")


def consumer_connections(conn: Connection, group: str) -> dict[str, Any] | None:
    """ConsumerConnection: `connectionSet` (clientId, clientAddr, language, version) and the broker's
    `subscriptionTable` for the group (topic -> SubscriptionData), `consumeType`, `messageModel`. None when
    no member of the group is connected to this broker (CONSUMER_NOT_ONLINE)."""
    answer = conn.call(remoting.GET_CONSUMER_CONNECTION_LIST, {"consumerGroup": group})
    if answer.code == remoting.CONSUMER_NOT_ONLINE:
        return None
    doc = _json(conn, _ok(conn, answer, f"the connections of group {group}"), "consumer connections")
    with _shaped(conn.address, f"connections of group {group}"):  # the fields the snapshot reads
        for member in doc.get("connectionSet") or []:
            _text(member["clientId"])
        for topic, sub in (doc.get("subscriptionTable") or {}).items():
            _text(topic)
            _optional_text(sub.get("subString"))
        return dict(doc)


@dataclass(frozen=True)
class HeldQueue:
    """A queue a consumer holds, with the offset it has consumed to in memory (ProcessQueueInfo)."""

    broker_name: str
    topic: str
    queue_id: int
    commit_offset: int
    dropped: bool


def consumer_running_info(conn: Connection, group: str, client_id: str) -> tuple[list[dict[str, Any]], list[HeldQueue]]:
    """A member's own subscriptions (SubscriptionData) and the queues it holds (ConsumerRunningInfo)."""
    answer = conn.call(remoting.GET_CONSUMER_RUNNING_INFO,
                       {"consumerGroup": group, "clientId": client_id, "jstackEnable": False})  # fmt: skip
    info = _json(conn, _ok(conn, answer, f"the running info of {client_id}"), "consumer running info")
    with _shaped(conn.address, f"running info of {client_id}"):
        held = []
        for key, queue in (info.get("mqTable") or {}).items():
            mq = json.loads(key)  # fastjson writes these map keys as objects (MessageQueue)
            held.append(HeldQueue(_text(mq["brokerName"]), _text(mq["topic"]), int(mq["queueId"]),
                                  int(queue["commitOffset"]), bool(queue.get("droped"))))  # fmt: skip
        subscriptions = list(info.get("subscriptionSet") or [])
        for sub in subscriptions:  # the fields the snapshot reads
            _text(sub["topic"])
            _optional_text(sub.get("subString"))
    return subscriptions, sorted(held, key=lambda q: (q.broker_name, q.topic, q.queue_id))


def pull_fields(group: str, topic: str, queue_id: int, offset: int) -> dict[str, Any]:
    """PullMessageRequestHeader: every message ("*" by tag) from `offset`, committing nothing."""
    return {"consumerGroup": group, "topic": topic, "queueId": queue_id, "queueOffset": offset,
            "maxMsgNums": PULL_BATCH, "sysFlag": PULL_SYS_FLAG, "commitOffset": 0, "suspendTimeoutMillis": 0,
            "subscription": "*", "subVersion": 0, "expressionType": "TAG"}  # fmt: skip


def send_pull(conn: Connection, group: str, topic: str, queue_id: int, offset: int) -> int:
    return conn.send(remoting.PULL_MESSAGE, pull_fields(group, topic, queue_id, offset))


def pull_result(answer: Command, address: str = "the broker") -> PullResult:
    f = answer.fields
    with _shaped(address, "pull answer"):
        return PullResult(answer.code, _long(f.get("nextBeginOffset")), _long(f.get("minOffset")),
                          _long(f.get("maxOffset")), answer.body, answer.remark)  # fmt: skip


def _long(text: str | None) -> int | None:
    return None if text is None else int(text)


def message_at(conn: Connection, topic: str, log_offset: int) -> bytes | None:
    """The message stored at a commit-log offset, as stored (VIEW_MESSAGE_BY_ID; `topic` for ACL), or None
    when the broker has none there."""
    answer = conn.call(remoting.VIEW_MESSAGE_BY_ID, {"topic": topic, "offset": log_offset})
    return answer.body if answer.code == remoting.SUCCESS and answer.body else None


def read_by_index(conn: Connection, topic: str, queue_id: int, offset: int) -> PullResult:
    """Up to PULL_BATCH messages of a queue the broker will not let us pull (RocketMQ 4.x keeps no topic
    config for its op topic: a pull answers TOPIC_NOT_EXIST), as the answer a pull would have given.

    QUERY_CONSUME_QUEUE reads the store's consume queue with no look at the topic table, and gives each
    entry's commit-log offset; VIEW_MESSAGE_BY_ID then returns each message as stored, the bytes a pull
    answer concatenates. The view requests are pipelined on the connection.
    """
    answer = conn.call(remoting.QUERY_CONSUME_QUEUE,
                       {"topic": topic, "queueId": queue_id, "index": offset, "count": PULL_BATCH})  # fmt: skip
    if answer.code == remoting.SYSTEM_ERROR and (answer.remark or "").endswith("is not exist!"):
        return PullResult(remoting.PULL_NOT_FOUND, offset, None, None, b"", answer.remark)  # no such queue yet
    if answer.code != remoting.SUCCESS:
        return PullResult(answer.code, None, None, None, b"", answer.remark)
    if not answer.body:  # the index is past the queue's end
        return PullResult(remoting.PULL_NOT_FOUND, offset, None, None, b"", answer.remark)
    what = f"the consume queue of {topic} queue {queue_id}"
    index = _json(conn, answer, what)
    with _shaped(conn.address, what):
        low, high = int(index["minQueueIndex"]), int(index["maxQueueIndex"])
        entries = [int(e["physicOffset"]) for e in index.get("queueData") or []]
    if offset < low:  # retention deleted what we had not read: go on from the queue's start, as a pull says
        return PullResult(remoting.PULL_OFFSET_MOVED, low, low, high, b"", "the offset is below the queue's start")
    sent = [conn.send(remoting.VIEW_MESSAGE_BY_ID, {"topic": topic, "offset": e}) for e in entries]
    bodies = []
    for opaque, entry in zip(sent, entries, strict=True):
        view = conn.receive(opaque)
        if view.code != remoting.SUCCESS:
            where = f"the message at commit-log offset {entry} of {topic} queue {queue_id}"
            return PullResult(view.code, None, None, None, b"", f"{where}: {first_line(view.remark)}")
        bodies.append(view.body)
    return PullResult(remoting.SUCCESS, offset + len(entries), low, high, b"".join(bodies), None)
