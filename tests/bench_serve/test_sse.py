"""SSE parsing on the bytes raypd and llama.cpp's server really sent (fixtures/, recorded once with
curl from `raypd serve` and llama-server b1-0c1e570 on SmolLM2; llama.cpp's model field shortened to
the name `--alias` gives it), fed whole, byte by byte and with CRLF line ends."""
from __future__ import annotations

from pathlib import Path

import pytest

from raypd.benchmarks.serve.sse import DONE, MalformedSSE, SSEParser, parse_chunk

FIXTURES = Path(__file__).parent / "fixtures"
# fixture -> (text, completion tokens, prompt tokens, cached tokens)
EXPECTED = {"raypd_chat.sse": ("The color I'm referring to", 6, 34, 0),
            "llamacpp_chat.sse": (None, 6, 34, 0),
            "raypd_completions.sse": (None, 5, 5, 0),
            "llamacpp_completions.sse": (None, 5, 5, 0)}


def _read(raw: bytes, piece: int) -> tuple[str, dict | None, bool, int]:
    parser, text, usage, done, chunks = SSEParser(), "", None, False, 0
    for i in range(0, len(raw), piece):
        for payload in parser.feed(raw[i:i + piece]):
            if payload == DONE:
                done = True
                continue
            c = parse_chunk(payload)
            assert c.error is None
            text += c.text
            chunks += bool(c.text)
            usage = c.usage or usage
    assert not parser.pending()
    return text, usage, done, chunks


@pytest.mark.parametrize("name", sorted(EXPECTED))
@pytest.mark.parametrize("piece", [1, 7, 1 << 20])
@pytest.mark.parametrize("crlf", [False, True])
def test_recorded_streams(name, piece, crlf):
    raw = (FIXTURES / name).read_bytes()
    if crlf:
        raw = raw.replace(b"\n", b"\r\n")
    text, usage, done, chunks = _read(raw, piece)
    want_text, out, prompt, cached = EXPECTED[name]
    assert done and usage is not None and text
    assert want_text is None or text == want_text
    assert (usage["completion_tokens"], usage["prompt_tokens"], usage["prompt_tokens_details"]["cached_tokens"]) == \
        (out, prompt, cached)
    assert chunks == out  # both servers send one text chunk per token here


def test_llamacpp_timings_cache_n():
    last = [p for p in SSEParser().feed((FIXTURES / "llamacpp_chat.sse").read_bytes()) if p != DONE][-1]
    assert parse_chunk(last).cache_n == 0


def test_events_fields_and_errors():
    p = SSEParser()
    assert p.feed(b": keep-alive\n\nevent: x\nid: 3\ndata: {\"choices\": []}\n") == []
    assert p.pending()
    assert p.feed(b"\n") == ['{"choices": []}']
    assert p.feed(b"data:a\ndata: b\n\n") == ["a\nb"]
    assert parse_chunk('{"error": {"message": "node failed"}}').error == "node failed"
    for bad in ("{not json", "[1, 2]", '{"choices": 3}', '{"choices": [1]}'):
        with pytest.raises(MalformedSSE):
            parse_chunk(bad)
