"""Incremental detokenization: token ids in, text deltas out, never half a character.

A byte-level BPE token can end in the middle of a multi-byte UTF-8 character; decoding it alone
gives U+FFFD. So each step decodes a small window (the tokens of the previous emitted delta, for the
tokenizer's context, plus the new ones), and emits only what the window adds beyond the text already
emitted, holding everything back while the window's text ends in U+FFFD. The window restarts at the
last emitted boundary, so the cost per token stays constant however long the output grows.

    emitted deltas joined == tokenizer.decode(all ids)   (checked in tests/serve/test_detokenizer.py)
"""
from __future__ import annotations

from collections.abc import Sequence

_REPLACEMENT = "\ufffd"


class IncrementalDetokenizer:
    def __init__(self, hf_tokenizer, skip_special_tokens: bool = True):
        self._hf = hf_tokenizer
        self._skip_special = skip_special_tokens
        self.ids: list[int] = []
        self._anchor = 0   # first token of the decoding window
        self._emitted = 0  # tokens whose text has been emitted

    def add(self, token_ids: Sequence[int]) -> str:
        """Append tokens; return the text they complete (possibly "")."""
        self.ids.extend(token_ids)
        return self._advance(final=False)

    def flush(self) -> str:
        """At the end of the output: whatever is still held back, incomplete or not."""
        return self._advance(final=True)

    def _decode(self, ids: list[int]) -> str:
        return self._hf.decode(ids, skip_special_tokens=self._skip_special, clean_up_tokenization_spaces=False)

    def _advance(self, final: bool) -> str:
        if self._emitted == len(self.ids):
            return ""
        seen = self._decode(self.ids[self._anchor:self._emitted])
        text = self._decode(self.ids[self._anchor:])
        complete = text.startswith(seen) and not text.endswith(_REPLACEMENT)
        if not complete and not final:
            return ""  # the next token completes the character (or settles the spacing)
        delta = text[len(seen):]  # at the end, a window that rewrote its start still yields its tail
        self._anchor, self._emitted = self._emitted, len(self.ids)
        return delta
