"""LLM: the offline entry point. `LLM().generate(prompts, SamplingParams(...))`."""
from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from raypd.engine.engine import LLMEngine
from raypd.engine.errors import InvalidRequestError
from raypd.engine.outputs import CompletionOutput
from raypd.engine.tokenizer import Prompt, Tokenizer, encode_prompt
from raypd.protocol.sampling_params import SamplingParams

if TYPE_CHECKING:  # typing.TypeIs arrives in Python 3.13; only the type checker needs it
    from typing_extensions import TypeIs


def _is_token_ids(prompts: Prompt | Sequence[Prompt]) -> TypeIs[Sequence[int]]:
    """Whether `prompts` is one prompt given as token ids rather than a list of prompts."""
    return isinstance(prompts, (list, tuple)) and len(prompts) > 0 and isinstance(prompts[0], int)


class LLM:
    def __init__(self, model: str | None = None, **engine_options):
        self.engine = LLMEngine(model, **engine_options)
        # Here, at the text edge, not in the engine: a node's engine sees token ids only, and
        # transformers' AutoTokenizer costs a node ~3.7 CPU-s and ~200 MB at every start.
        self.tokenizer = Tokenizer(self.engine.model_dir)

    def encode(self, prompt: Prompt) -> list[int]:
        return encode_prompt(self.tokenizer, prompt)

    def generate(self, prompts: Prompt | Sequence[Prompt],
                 params: SamplingParams | Sequence[SamplingParams] | None = None) -> list[CompletionOutput]:
        if isinstance(prompts, (str, dict)) or _is_token_ids(prompts):
            batch: list[Prompt] = [prompts]
        else:
            batch = list(prompts)
        if params is None:
            params = SamplingParams()
        plist = [params] * len(batch) if isinstance(params, SamplingParams) else list(params)
        if len(plist) != len(batch):
            raise InvalidRequestError("need one SamplingParams per prompt", "params")
        encoded = [self.encode(p) for p in batch]
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
                        assert out.finish_reason is not None, "a finished request has a finish reason"
                        final[out.request_id] = (out.finish_reason, out.num_cached_tokens)
        except BaseException:
            for r in rids:
                self.engine.abort(r)
            raise
        return [CompletionOutput(r, ids, tokens[r], self.tokenizer.decode(tokens[r]), *final[r])
                for r, ids in zip(rids, encoded)]
