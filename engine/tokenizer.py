"""Tokenizer and chat template, through transformers.AutoTokenizer. Only the edges use this: the
scheduler and model see token ids."""
from __future__ import annotations

from pathlib import Path

from raypd.engine.errors import InvalidRequestError


class Tokenizer:
    def __init__(self, model_dir: Path):
        from transformers import AutoTokenizer

        self.hf = AutoTokenizer.from_pretrained(str(model_dir))

    @property
    def vocab_size(self) -> int:
        return len(self.hf)

    def encode(self, text: str) -> list[int]:
        return self.hf.encode(text, add_special_tokens=True)

    def apply_chat_template(self, messages: list[dict]) -> list[int]:
        if not isinstance(messages, list) or not all(isinstance(m, dict) and "role" in m and "content" in m for m in messages):
            raise InvalidRequestError("messages must be a list of {role, content} objects", "messages")
        # Render, then tokenize without adding special tokens (the template holds them): what
        # tokenize=True does, minus its return type that changed between transformers 4 and 5.
        text = self.hf.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        assert isinstance(text, str), "one conversation renders to one string"
        return self.hf.encode(text, add_special_tokens=False)

    def decode(self, token_ids: list[int]) -> str:
        text = self.hf.decode(token_ids, skip_special_tokens=True)
        assert isinstance(text, str), "one sequence of ids decodes to one string"
        return text
