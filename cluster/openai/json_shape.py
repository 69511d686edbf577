"""How much structure a JSON body may hold, checked on the raw bytes before it is parsed.

Parsing runs on the event loop and holds the GIL whatever thread runs it (pydantic-core builds Python
objects), so its cost must be bounded before it starts. The body-size limit bounds bytes, not work:
within 4 MB, `[[1],[1],...]` is a million arrays and `{"0":1,"1":1,...}` half a million members, and
pydantic took 2-5 s on either here, most of it spent describing one error per item. Scalars inside
lists are cheap once every list stops at its first bad item (request_schema.py): 2M token ids parse
in ~0.3 s, as fast as json.loads. So what is bounded here is the structure: arrays, objects and
object members together (MAX_JSON_NODES). Nesting depth needs nothing of ours: the parser refuses
more than ~200 levels at once ("recursion limit exceeded", a 400 invalid_json).

A legitimate request holds at most ~7 nodes per chat message (the message, two members, a content
list, a part and its two members), so MAX_MESSAGES messages fit in 2^15 with room for tools and
response formats; 2^16 still parses in ~0.1-0.2 s at worst.

    raw.count of [ { :  <= limit   ->  parse (the common case: two passes of bytes.count, ~1 ms per MB)
    more                           ->  count again outside string literals (brackets and colons in a
                                       prompt's text are not structure; ~40 ms per MB)
    still more                     ->  400 json_too_complex, nothing parsed
"""
from __future__ import annotations

import re

from raypd.cluster.openai.api_errors import BadRequest

MAX_JSON_NODES = 1 << 16
# A JSON string literal, escapes included ("unrolled" so a long string is one linear scan).
_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"')


def json_nodes(raw: bytes, outside_strings: bool) -> int:
    """Arrays + objects + object members in `raw`; with outside_strings=False an upper bound that
    also counts the brackets and colons inside string literals."""
    text = _STRING.sub(b"", raw) if outside_strings else raw
    return text.count(b"[") + text.count(b"{") + text.count(b":")


def check_json_shape(raw: bytes, limit: int = MAX_JSON_NODES) -> None:
    """Raise a 400 when the body holds more than `limit` arrays, objects and members."""
    if json_nodes(raw, outside_strings=False) <= limit:
        return
    nodes = json_nodes(raw, outside_strings=True)
    if nodes > limit:
        raise BadRequest(f"the JSON body holds {nodes} arrays, objects and members; at most {limit} are "
                         f"accepted", None, "json_too_complex")
