"""A bare HTTP/2 (h2c, prior knowledge) client on the `h2` package, for tests that must control what an
HTTP client library decides for them: when a request's body is sent relative to its answer, and how much of
it, under the flow-control windows the server grants (a body larger than the connection's window arrives
only as fast as the server hands the window back)."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable

import h2.config
import h2.connection
import h2.events


class RawH2:
    """One connection; `headers` opens a stream, `data` queues its body, `receive` and `pump` read answers
    and send queued bodies as the windows allow. Streams answered so far: `status`, `body`, `ended`."""

    def __init__(self, url: str, headers: dict[str, str] | None = None):
        host, port = url.removeprefix("http://").rsplit(":", 1)
        self.authority = f"{host}:{port}"
        self.extra_headers = list((headers or {}).items())
        self.sock = socket.create_connection((host, int(port)), timeout=10)
        self.conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
        self.conn.initiate_connection()
        self.flush()
        self.status: dict[int, int] = {}
        self.body: dict[int, bytes] = {}
        self.ended: set[int] = set()
        self.ended_at: dict[int, float] = {}  # time.monotonic() when the stream's answer was complete
        # Request bodies (or what is left of them) waiting for window, and whether they end the stream.
        self.unsent: dict[int, tuple[memoryview, bool]] = {}
        self.closed = False

    def flush(self) -> None:
        self.sock.sendall(self.conn.data_to_send())

    def headers(self, content_type: str, length: int, end_stream: bool = False, auth: bool = True) -> int:
        stream = self.conn.get_next_available_stream_id()
        self.conn.send_headers(
            stream,
            [(":method", "POST"), (":path", "/draft"), (":scheme", "http"), (":authority", self.authority),
             ("content-type", content_type), ("content-length", str(length)),
             *(self.extra_headers if auth else [])],
            end_stream=end_stream,
        )  # fmt: skip
        self.flush()
        return stream

    def data(self, stream: int, payload: bytes, end: bool = True) -> None:
        """Send `payload` as far as the windows allow now; `receive` and `pump` send the rest as the server
        hands window back. The stream's body ends with it unless `end` is False (more comes later)."""
        self.unsent[stream] = (memoryview(payload), end)
        self.send_unsent()

    def send_unsent(self) -> None:
        for stream, (rest, end) in list(self.unsent.items()):
            while rest:
                size = min(self.conn.local_flow_control_window(stream), self.conn.max_outbound_frame_size)
                if size <= 0:
                    break
                self.conn.send_data(stream, rest[:size].tobytes())
                rest = rest[size:]
            if rest:
                self.unsent[stream] = (rest, end)
                continue
            del self.unsent[stream]
            if end:
                self.conn.end_stream(stream)
        self.flush()

    def post(self, payload: bytes) -> int:
        stream = self.headers("application/json", len(payload))
        self.data(stream, payload)
        return stream

    def receive(self, until: set[int], timeout_s: float = 10, status_of: int | None = None) -> None:
        """Read events until every stream in `until` has ended (or `status_of` has its status), the connection
        closes, or time runs out."""
        if status_of is not None:
            self.read_until(lambda: status_of in self.status, timeout_s)
        else:
            self.read_until(lambda: until <= self.ended, timeout_s)

    def pump(self, seconds: float) -> None:
        """Go on reading (and sending what the windows let through) for `seconds`, waiting for nothing."""
        self.read_until(lambda: False, seconds)

    def read_until(self, done: Callable[[], bool], timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while not done() and not self.closed and time.monotonic() < deadline:
            self.sock.settimeout(max(deadline - time.monotonic(), 0.01))
            try:
                data = self.sock.recv(65536)
            except TimeoutError:
                break
            if not data:
                self.closed = True
                break
            for event in self.conn.receive_data(data):
                self.on_event(event)
            if not self.closed:
                self.send_unsent()  # the window the server handed back is used at once

    def on_event(self, event: h2.events.Event) -> None:
        if isinstance(event, h2.events.ResponseReceived):
            self.status[event.stream_id] = int(dict(event.headers)[b":status"])
        elif isinstance(event, h2.events.DataReceived):
            self.body[event.stream_id] = self.body.get(event.stream_id, b"") + event.data
            self.conn.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
        elif isinstance(event, h2.events.StreamEnded | h2.events.StreamReset):
            self.ended.add(event.stream_id)
            self.ended_at[event.stream_id] = time.monotonic()
            if isinstance(event, h2.events.StreamReset):
                # Only a reset stops a body: after a complete answer a client goes on sending (RFC 9113, 8.1).
                self.unsent.pop(event.stream_id, None)
        elif isinstance(event, h2.events.ConnectionTerminated):
            self.closed = True

    def close(self) -> None:
        self.sock.close()
