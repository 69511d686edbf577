"""LLM: the offline entry point. `LLM().generate(prompts, SamplingParams(...))`."""
from __future__ import annotations

from collections.abc import Sequence

from raypd.engine.engine import LLMEngine
from raypd.engine.errors import InvalidRequestError
from raypd.engine.outputs import CompletionOutput
from raypd.engine.sampling_params import SamplingParams

Prompt = str | Sequence[int] | dict


def encode_prompt(tokenizer, prompt: Prompt) -> list[int]:
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


class LLM:
    def __init__(self, model: str | None = None, **engine_options):
        self.engine = LLMEngine(model, **engine_options)
        self.tokenizer = self.engine.tokenizer

    def encode(self, prompt: Prompt) -> list[int]:
        return encode_prompt(self.tokenizer, prompt)

    def generate(self, prompts: Prompt | Sequence[Prompt],
                 params: SamplingParams | Sequence[SamplingParams] | None = None) -> list[CompletionOutput]:
        if isinstance(prompts, (str, dict)) or (prompts and isinstance(prompts[0], int)):
            prompts = [prompts]
        params = params or SamplingParams()
        plist = list(params) if isinstance(params, (list, tuple)) else [params] * len(prompts)
        if len(plist) != len(prompts):
            raise InvalidRequestError("need one SamplingParams per prompt", "params")
        encoded = [self.encode(p) for p in prompts]
        rids = []
        try:
            for ids, p in zip(encoded, plist):
                rids.append(self.engine.add_request(ids, p))
            tokens: dict[str, list[int]] = {r: [] for r in rids}
            final: dict[str, tuple[str, int]] = {}
            while len(final) < len(rids):
                for out in self.engine.step():
                    tokens[out.request_id].extend(out.new_token_ids)
                    if out.finished:
                        final[out.request_id] = (out.finish_reason, out.num_cached_tokens)
        except BaseException:
            for r in rids:
                self.engine.abort(r)
            raise
        return [CompletionOutput(r, ids, tokens[r], self.tokenizer.decode(tokens[r]), *final[r])
                for r, ids in zip(rids, encoded)]
