"""Small HTTP helpers for the dashboard tests: plain requests and an SSE reader."""

from __future__ import annotations

import http.client
import json
import time
from typing import Any
from urllib.parse import urlsplit


def base_of(link: str) -> str:
    """``http://host:port/status`` (or a login link) -> ``http://host:port``."""
    parts = urlsplit(link)
    return f"{parts.scheme}://{parts.netloc}"


def request(
    url: str, method: str = "GET", cookie: str | None = None, timeout: float = 10
) -> tuple[int, dict[str, str], bytes]:
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=timeout)
    try:
        path = parts.path + (f"?{parts.query}" if parts.query else "")
        conn.request(method, path, headers={"Cookie": cookie} if cookie else {})
        response = conn.getresponse()
        return response.status, dict(response.getheaders()), response.read()
    finally:
        conn.close()


def get_json(url: str, cookie: str | None = None) -> Any:
    status, _, body = request(url, cookie=cookie)
    assert status == 200, (status, body[:500])
    return json.loads(body)


class EventStream:
    """An open ``/api/v1/stream``: read events as (topic, data, raw bytes)."""

    def __init__(self, url: str, cookie: str | None = None, timeout: float = 10):
        parts = urlsplit(url)
        self.conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=timeout)
        path = parts.path + (f"?{parts.query}" if parts.query else "")
        self.conn.request("GET", path, headers={"Cookie": cookie} if cookie else {})
        self.response = self.conn.getresponse()
        assert self.response.status == 200, self.response.status
        assert self.response.getheader("Content-Type") == "text/event-stream"
        self.comments = 0

    def next_event(self) -> tuple[str, Any, bytes]:
        lines: list[bytes] = []
        while True:
            line = self.response.readline()  # (chunked: decoded by the response)
            if not line:
                raise EOFError("the stream ended")
            if line == b"\n":
                if lines and all(x.startswith(b":") for x in lines):
                    self.comments += 1
                    lines = []
                    continue
                if lines:
                    break
                continue
            lines.append(line)
        topic = lines[0].removeprefix(b"event: ").strip().decode()
        data = lines[1].removeprefix(b"data: ")
        return topic, json.loads(data), b"".join(lines)

    def events_until(self, predicate: Any, timeout: float = 20) -> list[tuple[str, Any, bytes]]:
        got = []
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            event = self.next_event()
            got.append(event)
            if predicate(event):
                return got
        raise TimeoutError(f"no such event within {timeout}s; got {[e[0] for e in got]}")

    def close(self) -> None:
        self.conn.close()
