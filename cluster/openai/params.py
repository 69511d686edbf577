"""From a validated OpenAI request to what the nodes run: token ids per prompt, one SamplingParams
per choice, and the stop strings the ingress applies itself.

Everything a node would reject is rejected here first, with the field to blame: the prompt against
the context length, the vocabulary and the smallest node's KV capacity; max_tokens against what is
left of the context; sampling values through SamplingParams' own checks (InvalidRequestError -> 400).
A request that passes cannot fail on a node for a reason the client could have fixed.

Checks run cheapest first, each before the work it bounds: prompts x n before any prompt is
tokenized or any SamplingParams built (check_generations), a token prompt's length before its ids
are scanned.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from raypd.cluster.openai.api_errors import BadRequest
from raypd.cluster.openai.request_schema import ChatCompletionRequest, CompletionRequest, TextPart, _SamplingFields
from raypd.protocol.sampling_params import SamplingParams

MAX_GENERATIONS = 64  # prompts x n in one request: bounds what one HTTP call can put on the nodes


@dataclass(frozen=True, slots=True)
class ModelLimits:
    name: str                  # the served model id clients put in "model"
    context_len: int           # max_position_embeddings: prompt + output never exceed it
    vocab_size: int
    block_size: int
    decode_kv_tokens: int      # KV capacity (tokens) of the smallest node that decodes
    prefill_kv_tokens: int     # ... and of the smallest node that prefills
    default_max_tokens: int | None = None  # cap when the request sets none (None: the rest of the context)


@dataclass(frozen=True, slots=True)
class ChoiceJob:
    """One generation: choice `index` of the response, for prompt `prompt_index`."""
    index: int
    prompt_index: int
    params: SamplingParams


@dataclass(frozen=True, slots=True)
class PreparedRequest:
    prompts: list[list[int]]
    jobs: list[ChoiceJob]
    stops: tuple[str, ...]


def check_supported(req: ChatCompletionRequest | CompletionRequest, limits: ModelLimits) -> None:
    """400 for a known field raypd does not implement (rather than silently ignoring it)."""
    if req.model != limits.name:
        raise BadRequest(f"The model '{req.model}' does not exist; this server serves '{limits.name}'",
                         "model", "model_not_found")
    if req.logit_bias:
        raise BadRequest("logit_bias is not supported", "logit_bias", "unsupported_parameter")
    if isinstance(req, ChatCompletionRequest):
        if req.logprobs or req.top_logprobs:
            raise BadRequest("logprobs are not supported", "logprobs", "unsupported_parameter")
        if req.response_format is not None and req.response_format.type != "text":
            raise BadRequest(f"response_format {req.response_format.type!r} is not supported; only 'text'",
                             "response_format", "unsupported_parameter")
        if req.tools or req.tool_choice not in (None, "none"):
            raise BadRequest("tools are not supported", "tools", "unsupported_parameter")
        if req.max_tokens is not None and req.max_completion_tokens is not None \
                and req.max_tokens != req.max_completion_tokens:
            raise BadRequest("max_tokens and max_completion_tokens disagree; set one", "max_completion_tokens")
    else:
        if req.logprobs is not None:
            raise BadRequest("logprobs are not supported", "logprobs", "unsupported_parameter")
        if req.suffix:
            raise BadRequest("suffix is not supported", "suffix", "unsupported_parameter")
        if req.best_of is not None and req.best_of != req.n:
            raise BadRequest("best_of other than n is not supported", "best_of", "unsupported_parameter")


def chat_messages(req: ChatCompletionRequest) -> list[dict]:
    """Messages as the chat template expects them: role and plain-text content."""
    out = []
    for i, m in enumerate(req.messages):
        if m.content is None or isinstance(m.content, str):
            text = m.content or ""
        else:
            parts = []
            for part in m.content:
                if not isinstance(part, TextPart):
                    raise BadRequest(f"content part type {part.type!r} is not supported; only 'text'",
                                     f"messages[{i}].content", "unsupported_content")
                parts.append(part.text)
            text = "\n".join(parts)
        # "developer" is the API's newer name for the system role; templates know only "system".
        out.append({"role": "system" if m.role == "developer" else m.role, "content": text})
    return out


def check_generations(req: ChatCompletionRequest | CompletionRequest, prompt_count: int) -> None:
    """400 when prompts x n passes MAX_GENERATIONS; run it before any per-prompt or per-choice work."""
    if prompt_count * req.n > MAX_GENERATIONS:
        raise BadRequest(f"prompts x n is {prompt_count} x {req.n} = {prompt_count * req.n}; at most "
                         f"{MAX_GENERATIONS} per request", "n", "too_many_generations")


def prepare(req: ChatCompletionRequest | CompletionRequest, prompts: list[list[int]],
            limits: ModelLimits, tenant: str = "") -> PreparedRequest:
    check_generations(req, len(prompts))
    param = "messages" if isinstance(req, ChatCompletionRequest) else "prompt"
    for ids in prompts:
        check_prompt(ids, limits, param)
    requested = req.max_tokens
    if isinstance(req, ChatCompletionRequest) and req.max_completion_tokens is not None:
        requested = req.max_completion_tokens
    jobs = []
    for p, ids in enumerate(prompts):
        max_tokens = _max_tokens(requested, len(ids), limits)
        for j in range(req.n):
            jobs.append(ChoiceJob(p * req.n + j, p, _sampling_params(req, max_tokens, j, limits, tenant)))
    stops = (req.stop,) if isinstance(req.stop, str) else tuple(req.stop or ())
    if any(not s for s in stops):
        raise BadRequest("stop strings must not be empty", "stop")
    return PreparedRequest(prompts, jobs, stops)


def check_prompt(ids: Sequence[int], limits: ModelLimits, param: str) -> None:
    if not ids:
        raise BadRequest("the prompt is empty", param)
    if len(ids) >= limits.context_len:
        raise BadRequest(f"This model's maximum context length is {limits.context_len} tokens; the prompt has "
                         f"{len(ids)}", param, "context_length_exceeded")
    if len(ids) + 1 > limits.prefill_kv_tokens:
        raise BadRequest(f"the prompt has {len(ids)} tokens; a prefill node's KV cache holds "
                         f"{limits.prefill_kv_tokens}", param, "context_length_exceeded")
    if min(ids) < 0 or max(ids) >= limits.vocab_size:  # C-speed scans; the loop below only names the id
        bad = next(t for t in ids if not 0 <= t < limits.vocab_size)
        raise BadRequest(f"token id {bad} is outside the vocabulary [0, {limits.vocab_size})", param)


def _max_tokens(requested: int | None, prompt_len: int, limits: ModelLimits) -> int:
    room = min(limits.context_len, limits.decode_kv_tokens) - prompt_len
    if requested is None:
        if room < 1:
            raise BadRequest(f"the prompt has {prompt_len} tokens, leaving no room for output "
                             f"(limit {min(limits.context_len, limits.decode_kv_tokens)})", "max_tokens",
                             "context_length_exceeded")
        return min(room, limits.default_max_tokens or room)
    if requested < 1:
        raise BadRequest(f"max_tokens must be at least 1, got {requested}", "max_tokens")
    if prompt_len + requested > limits.context_len:
        raise BadRequest(f"This model's maximum context length is {limits.context_len} tokens; you requested "
                         f"{prompt_len + requested} ({prompt_len} in the prompt, {requested} for the output)",
                         "max_tokens", "context_length_exceeded")
    if prompt_len + requested > limits.decode_kv_tokens:
        raise BadRequest(f"prompt ({prompt_len}) plus max_tokens ({requested}) exceeds the KV cache of a "
                         f"decode node ({limits.decode_kv_tokens} tokens)", "max_tokens",
                         "context_length_exceeded")
    return requested


def _sampling_params(req: _SamplingFields, max_tokens: int, choice: int, limits: ModelLimits,
                     tenant: str = "") -> SamplingParams:
    stop_ids = tuple(req.stop_token_ids or ())
    bad = next((t for t in stop_ids if not 0 <= t < limits.vocab_size), None)
    if bad is not None:
        raise BadRequest(f"stop token id {bad} is outside the vocabulary [0, {limits.vocab_size})", "stop_token_ids")
    return SamplingParams(
        max_tokens=max_tokens,
        temperature=1.0 if req.temperature is None else req.temperature,
        top_p=1.0 if req.top_p is None else req.top_p,
        top_k=-1 if req.top_k is None else req.top_k,
        min_p=0.0 if req.min_p is None else req.min_p,
        presence_penalty=req.presence_penalty or 0.0,
        frequency_penalty=req.frequency_penalty or 0.0,
        repetition_penalty=1.0 if req.repetition_penalty is None else req.repetition_penalty,
        seed=None if req.seed is None else _nth_seed(req.seed, choice),
        stop_token_ids=stop_ids,
        ignore_eos=req.ignore_eos,
        priority=req.priority or 0,
        tenant=tenant,
    )


def _nth_seed(seed: int, choice: int) -> int:
    """Choice j of a seeded request samples with seed + j, wrapped into the 64-bit range torch takes,
    so choices differ from each other and each is reproducible."""
    return (seed + choice + 2**63) % 2**64 - 2**63
