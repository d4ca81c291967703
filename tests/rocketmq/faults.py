"""A fault proxy for the remoting protocol on loopback: it forwards whole frames (the 4-byte length prefix, then
the frame) between a client and a RocketMQ server, and can misbehave as a network does. Toxiproxy does not
install from the package registries this project reaches, so the suite has this one.

Faults (`mode`), on the answers the server sends back:
- "pass": every answer as it came;
- "slow": every answer held `delay_s` first (beyond the client's timeout);
- "reset": a large answer (a pull that found messages) cut in the middle by a connection reset;
- "cut": a large answer cut in the middle, then the connection closed in order (a frame cut short);
- "silent": connections are accepted and requests read, and nothing is ever answered.
`rewrite` changes each answer frame (its body) before it is sent, e.g. to list another broker.
"""

from __future__ import annotations

import contextlib
import select
import socket
import struct
import threading
import time
from collections.abc import Callable

LARGE = 1_000  # bytes: an answer this long carries messages


def with_body(frame: bytes, body: Callable[[bytes], bytes]) -> bytes:
    """The frame with its body changed (the header stays; the length prefix follows)."""
    header_len = struct.unpack(">i", frame[4:8])[0] & 0xFFFFFF
    head = frame[4 : 8 + header_len]
    new = head + body(frame[8 + header_len :])
    return struct.pack(">i", len(new)) + new


class FaultProxy:
    """Set `mode` at any time: it applies to the answers that follow. `faults` counts the answers it touched."""

    def __init__(self, listen: tuple[str, int], target: tuple[str, int],
                 rewrite: Callable[[bytes], bytes] | None = None, delay_s: float = 0.0) -> None:  # fmt: skip
        self.target, self.rewrite, self.delay_s = target, rewrite, delay_s
        self.mode = "pass"
        self.faults = 0
        self._server = socket.create_server(listen)
        self.address = "{}:{}".format(*self._server.getsockname()[:2])
        self._closed = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def close(self) -> None:
        self._closed.set()
        self._server.close()

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self._server.accept()
            except OSError:
                return
            threading.Thread(target=self._pipe, args=(client,), daemon=True).start()

    def _pipe(self, client: socket.socket) -> None:
        """One connection, both ways, in one thread: a socket is closed only here, never under another
        thread's receive (which would keep it open, and its reset unsent)."""
        try:
            server = socket.create_connection(self.target, timeout=5)
        except OSError:
            client.close()
            return
        pending = {client: bytearray(), server: bytearray()}
        held: list[tuple[float, bytes]] = []  # "slow": answers and when they go
        try:
            while not self._closed.is_set():
                wait = min([due for due, _ in held], default=time.monotonic() + 0.2) - time.monotonic()
                readable, _, _ = select.select([client, server], [], [], max(wait, 0))
                for sock in readable:
                    data = sock.recv(65536)
                    if not data:
                        return
                    pending[sock] += data
                    while (frame := _take_frame(pending[sock])) is not None:
                        if sock is client:
                            server.sendall(frame)
                        elif not self._answer(frame, client, held):
                            return
                while held and held[0][0] <= time.monotonic():
                    client.sendall(held.pop(0)[1])
        except OSError:
            return
        finally:
            client.close()
            server.close()

    def _answer(self, frame: bytes, client: socket.socket, held: list[tuple[float, bytes]]) -> bool:
        """Send (or not) one answer as the mode says; False ends the connection."""
        if self.rewrite is not None:
            frame = self.rewrite(frame)
        mode = self.mode
        if mode == "pass" or (mode in ("reset", "cut") and len(frame) <= LARGE):
            client.sendall(frame)
            return True
        self.faults += 1
        if mode == "slow":
            held.append((time.monotonic() + self.delay_s, frame))
        elif mode in ("reset", "cut"):
            client.sendall(frame[: len(frame) // 2])
            if mode == "reset":  # SO_LINGER 0: the close sends a reset, not an orderly end
                client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            return False
        return True  # "silent": dropped


def _take_frame(buf: bytearray) -> bytes | None:
    """The first whole frame (with its length prefix) out of `buf`, if there is one."""
    if len(buf) < 4:
        return None
    end = 4 + struct.unpack(">i", buf[:4])[0]
    if len(buf) < end:
        return None
    frame = bytes(buf[:end])
    del buf[:end]
    return frame


class Blackhole:
    """A listener that accepts connections and never answers: a broker that hangs."""

    def __init__(self, host: str = "127.0.0.1") -> None:
        self._server = socket.create_server((host, 0))
        self.address = "{}:{}".format(*self._server.getsockname()[:2])
        self._held: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._server.accept()
            except OSError:
                return
            self._held.append(conn)

    def close(self) -> None:
        self._server.close()
        for s in self._held:
            with contextlib.suppress(OSError):
                s.close()
