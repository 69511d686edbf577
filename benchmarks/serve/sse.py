"""Server-Sent Events as OpenAI-compatible servers stream them, parsed from raw bytes.

`SSEParser.feed(bytes)` returns the complete events' `data` payloads; events end at a blank line
(LF or CRLF), several `data:` lines join with newlines, comment lines (`:`) and other fields are
dropped. `parse_chunk` reads one payload: the text it adds (chat `delta.content` or completion
`text`), its usage, and an in-stream error. Both raypd and llama.cpp's server send a final usage
chunk with `stream_options.include_usage`; llama.cpp also puts its own `timings` (with `cache_n`,
the prompt tokens it reused) on the last chunk.
"""
from __future__ import annotations

import json
from dataclasses import dataclass

DONE = "[DONE]"


class MalformedSSE(ValueError):
    """A payload that is not the JSON object a chunk must be."""


class SSEParser:
    def __init__(self) -> None:
        self._buf = b""
        self._data: list[str] = []

    def feed(self, chunk: bytes) -> list[str]:
        self._buf += chunk
        out: list[str] = []
        while True:
            nl = self._buf.find(b"\n")
            if nl < 0:
                return out
            line, self._buf = self._buf[:nl].rstrip(b"\r"), self._buf[nl + 1:]
            if not line:
                if self._data:
                    out.append("\n".join(self._data))
                    self._data = []
                continue
            if line.startswith(b":"):
                continue
            name, _, value = line.partition(b":")
            if name == b"data":
                self._data.append(value[1:].decode() if value.startswith(b" ") else value.decode())

    def pending(self) -> bool:
        """Bytes or data lines of an event not yet ended by a blank line."""
        return bool(self._buf.strip() or self._data)


@dataclass(frozen=True, slots=True)
class Chunk:
    text: str = ""
    usage: dict | None = None
    error: str | None = None
    finish_reason: str | None = None
    cache_n: int | None = None  # llama.cpp's timings.cache_n


def parse_chunk(payload: str) -> Chunk:
    try:
        obj = json.loads(payload)
    except json.JSONDecodeError as e:
        raise MalformedSSE(f"not JSON: {payload[:80]!r}") from e
    if not isinstance(obj, dict):
        raise MalformedSSE(f"not an object: {payload[:80]!r}")
    if "error" in obj:
        err = obj["error"]
        return Chunk(error=str(err.get("message", err) if isinstance(err, dict) else err))
    text, finish = "", None
    choices = obj.get("choices") or []
    if not isinstance(choices, list):
        raise MalformedSSE("choices is not a list")
    for c in choices:
        if not isinstance(c, dict):
            raise MalformedSSE("a choice is not an object")
        delta = c.get("delta")
        piece = delta.get("content") if isinstance(delta, dict) else c.get("text")
        text += piece or ""
        finish = c.get("finish_reason") or finish
    timings = obj.get("timings")
    cache_n = timings.get("cache_n") if isinstance(timings, dict) else None
    usage = obj.get("usage") if isinstance(obj.get("usage"), dict) else None
    return Chunk(text, usage, None, finish, cache_n)
