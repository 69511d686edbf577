"""Ingress under hostile inputs (issue 16): does one request stall a replica?

Against a real `raypd serve` (started here: 1 prefill + 1 decode node, one ingress replica; or
--url for a running one): for each hostile input, a stream runs on the replica (chat, ignore_eos)
and, once it has streamed for --warm-s, the input is sent over raw HTTP exactly as a client would
(compact JSON, as the openai client's httpx encodes it). Reported per input:
  status, code       the answer (every one should be a 4xx)
  answer_ms          last byte of the body sent -> the answer's status line received
  gap_ms             the stream's longest gap between two events from the input's first byte until 1 s
                     after its answer (the time the input could have stalled the loop)
  base_gap_ms        the same stream's longest gap over the --warm-s before (its normal pace)

    python -m raypd bench hostile --json bench-results/ingress_hostile.json
    python benchmarks/ingress_hostile.py --url http://127.0.0.1:8000
"""
from __future__ import annotations

import argparse
import http.client
import json
import socket
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from urllib.parse import urlparse

STREAM_PROMPT = "Tell me a long story about a lighthouse keeper."


def inputs(model: str) -> dict[str, bytes]:
    """The hostile bodies of issue 16 (and the two that cost most before it), all for /v1/*."""
    def body(**fields) -> bytes:
        return json.dumps({"model": model, **fields}, separators=(",", ":")).encode()

    nested = b'{"model":"%s","prompt":' % model.encode()
    return {
        "1M-element prompt array, n=16": body(prompt=[[1]] * 1_000_000, n=16),
        "n=16 with 64 prompts": body(prompt=["Hi"] * 64, n=16, max_tokens=1),
        "10,000 messages": body(messages=[{"role": "user", "content": "Hi"}] * 10_000, max_tokens=1),
        "4,096 messages (templated, then too long)": body(messages=[{"role": "user", "content": "Hi"}] * 4096,
                                                          max_tokens=1),
        "1 MB stop string": body(prompt="Hi", stop="x" * (1 << 20), max_tokens=1),
        "nested 100,000 deep": nested + b"[" * 100_000 + b"]" * 100_000 + b"}",
        "nested 10,000 deep": nested + b"[" * 10_000 + b"]" * 10_000 + b"}",
        "800,000 nulls as the prompt": body(prompt=[None] * 800_000),
        "300,000 metadata members": body(messages=[{"role": "user", "content": "Hi"}],
                                         metadata={str(i): "" for i in range(300_000)}),
        "600,000-character prompt (tokenized, then too long)": body(prompt="hello world, " * 46_000, max_tokens=1),
        "one byte per second (`[1]`)": b"[1]",
    }


@dataclass
class Result:
    name: str
    bytes: int
    status: int
    code: str | None
    answer_ms: float
    gap_ms: float
    base_gap_ms: float


class Stream:
    """A chat stream on its own thread, timestamping every SSE event."""

    def __init__(self, host: str, port: int, model: str):
        self.times: list[float] = []
        self.conn = http.client.HTTPConnection(host, port, timeout=120)
        self.conn.request("POST", "/v1/chat/completions", json.dumps({
            "model": model, "messages": [{"role": "user", "content": STREAM_PROMPT}], "stream": True,
            "max_tokens": 4000, "ignore_eos": True}), {"Content-Type": "application/json"})
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        try:
            resp = self.conn.getresponse()
            for line in resp:
                if line.startswith(b"data: "):
                    self.times.append(time.monotonic())
        except Exception:  # noqa: BLE001 - stop() closes the socket under the reader, which fails anyhow
            pass

    def max_gap(self, t0: float, t1: float) -> float:
        """Longest gap between consecutive events overlapping [t0, t1] (until t1 if none came)."""
        times = [t for t in self.times if t <= t1]
        gaps = [b - a for a, b in zip(times, times[1:]) if b >= t0]
        if times and times[-1] < t1:
            gaps.append(t1 - max(times[-1], t0))
        return max(gaps, default=t1 - t0)

    def stop(self) -> None:
        try:
            if self.conn.sock is not None:
                self.conn.sock.shutdown(socket.SHUT_RDWR)  # the server sees the client leave and aborts
        except OSError:
            pass
        self.conn.close()
        self.thread.join(10)


def send(host: str, port: int, path: str, body: bytes,
         byte_gap_s: float = 0.0) -> tuple[float, float, float, int, str | None]:
    """POST `body` (one byte per `byte_gap_s` if set): (first byte sent, last byte sent, status line
    received) as monotonic times, the status and the error code."""
    with socket.create_connection((host, port), timeout=120) as s:
        head = (f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(body)}\r\n\r\n").encode()
        start = time.monotonic()
        s.sendall(head)
        if byte_gap_s:
            for b in body:
                time.sleep(byte_gap_s)
                s.sendall(bytes([b]))
        else:
            s.sendall(body)
        sent = time.monotonic()
        first = s.recv(65536)
        answered = time.monotonic()
        status, payload = read_response(s, first)
    try:
        code = json.loads(payload)["error"]["code"]
    except (ValueError, KeyError, TypeError):
        code = None
    return start, sent, answered, status, code


def read_response(s: socket.socket, raw: bytes = b"") -> tuple[int, bytes]:
    """Read one whole HTTP/1.1 response (its Content-Length's worth) after `raw`: (status, body)."""
    while b"\r\n\r\n" not in raw or len(raw.partition(b"\r\n\r\n")[2]) < _content_length(raw):
        more = s.recv(65536)
        if not more:
            break
        raw += more
    head, _, payload = raw.partition(b"\r\n\r\n")
    return int(head.split()[1]), payload


def _content_length(raw: bytes) -> int:
    for line in raw.partition(b"\r\n\r\n")[0].split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            return int(line.split(b":")[1])
    return 1 << 30


def measure(url: str, model: str, warm_s: float) -> list[Result]:
    u = urlparse(url)
    host, port = u.hostname or "127.0.0.1", u.port or 80
    results = []
    for name, body in inputs(model).items():
        path = "/v1/chat/completions" if b'"messages"' in body[:200] else "/v1/completions"
        stream = Stream(host, port, model)
        try:
            while len(stream.times) < 3:  # streaming
                time.sleep(0.05)
            time.sleep(warm_s)
            slow = name.startswith("one byte per second")
            start, sent, answered, status, code = send(host, port, path, body, 1.0 if slow else 0.0)
            time.sleep(1.0)
            gap = stream.max_gap(start, answered + 1.0)
            base = stream.max_gap(start - warm_s, start)
        finally:
            stream.stop()
        results.append(Result(name, len(body), status, code, 1e3 * (answered - sent), 1e3 * gap, 1e3 * base))
        print(f"{name:55s} {len(body):>9d} B  {status} {code or '':22s} answer {1e3 * (answered - sent):7.1f} ms"
              f"  gap {1e3 * gap:6.0f} ms (base {1e3 * base:4.0f} ms)", flush=True)
    return results


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="raypd bench hostile", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--url", help="a running raypd serve (default: start one here and stop it after)")
    p.add_argument("--model", default="SmolLM2-135M-Instruct.Q4_1")
    p.add_argument("--warm-s", type=float, default=2.0, help="stream time before each input (its base gap)")
    p.add_argument("--json", type=Path, help="write the results here")
    args = p.parse_args(argv)
    launched = None
    if args.url is None:
        from raypd.benchmarks.serve.systems import LaunchOptions, launch

        launched = launch("raypd-pd", LaunchOptions(), Path(tempfile.mkdtemp(prefix="raypd-hostile-")))
        url = f"http://127.0.0.1:{launched.port}"
    else:
        url = args.url
    try:
        results = measure(url, args.model, args.warm_s)
    finally:
        if launched is not None:
            left = launched.stop()
            if left:
                print(f"processes left after stopping the server: {left}", file=sys.stderr)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps([asdict(r) for r in results], indent=2))
    return 0 if all(400 <= r.status < 500 for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
