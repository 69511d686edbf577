"""Tokenizer and chat template, through transformers. Only the edges use this: the scheduler and
model see token ids.

A folder whose tokenizer_config.json names the generic fast tokenizer (what raypd writes for a GGUF,
and many Hugging Face models) loads it as that class directly: AutoTokenizer would first read the
model's config through AutoConfig, which imports the model family's configuration module and with it
torch, about 3.5 s of CPU at every ingress replica's start for the same tokenizer object. Any other
class name (Qwen2Tokenizer, GemmaTokenizer, ...) goes through AutoTokenizer as before."""
from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from raypd.engine.errors import InvalidRequestError

Prompt = str | Sequence[int] | dict

# The names transformers gives its generic tokenizers-backed class (5.x; PreTrainedTokenizerFast is
# its alias, the name older folders carry).
GENERIC_FAST = frozenset({"TokenizersBackend", "PreTrainedTokenizerFast"})


def declared_class(model_dir: Path) -> str | None:
    """The tokenizer_class the folder's tokenizer_config.json names, if it can be read."""
    try:
        config = json.loads((Path(model_dir) / "tokenizer_config.json").read_text())
    except (OSError, ValueError):
        return None
    name = config.get("tokenizer_class") if isinstance(config, dict) else None
    return name if isinstance(name, str) else None


class Tokenizer:
    def __init__(self, model_dir: Path):
        if declared_class(model_dir) in GENERIC_FAST and (Path(model_dir) / "tokenizer.json").exists():
            from transformers import PreTrainedTokenizerFast

            self.hf = PreTrainedTokenizerFast.from_pretrained(str(model_dir))
        else:
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


def encode_prompt(tokenizer: Tokenizer, prompt: Prompt) -> list[int]:
    """A string, a list of token ids, or {"prompt"|"prompt_token_ids"|"messages": ...}."""
    if isinstance(prompt, dict):
        if "messages" in prompt:
            return tokenizer.apply_chat_template(prompt["messages"])
        if "prompt_token_ids" in prompt:
            return list(prompt["prompt_token_ids"])
        if "prompt" in prompt:
            return encode_prompt(tokenizer, prompt["prompt"])
        raise InvalidRequestError("a prompt object needs 'prompt', 'prompt_token_ids' or 'messages'", "prompt")
    if isinstance(prompt, str):
        return tokenizer.encode(prompt)
    if isinstance(prompt, (list, tuple)):
        return list(prompt)
    raise InvalidRequestError(f"unsupported prompt type {type(prompt).__name__}", "prompt")
