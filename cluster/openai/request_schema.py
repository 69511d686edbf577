"""Request bodies of the OpenAI API that the ingress serves, as pydantic models.

Strict on purpose: a wrong-typed field (a string for max_tokens, 1.5 for n) is a 400, not a silent
coercion, and an unknown field is a 400 as the OpenAI API answers it, so a typo such as `max_token`
never passes unnoticed. Fields the API defines but raypd cannot honour are declared, so the ingress
can reject them by name with a reason (see params.py) instead of "unrecognized argument".
Numeric ranges the engine knows (temperature, top_p, penalties) are checked by SamplingParams; the
bounds here are the ones that must hold before anything is computed (n, seed width, how many prompts,
messages and stop strings, how long a stop string).

Every list stops at its first bad item (`fail_fast`): by default pydantic reports one error per item,
and a 4 MB body of 800,000 nulls in `prompt` took 16 s of the event loop to describe (three errors per
item, one per union member). What the schema cannot bound cheaply - how many arrays, objects and
members the JSON holds - json_shape.py bounds before the body is parsed.
"""
from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

# Seeds seed torch.Generator, which takes any value that fits in 64 bits.
Seed = Annotated[int, Field(ge=-(2**63), le=2**64 - 1)]
MAX_N = 16
MAX_STOP_STRINGS = 4
# A stop string is matched against every delta of every choice; the partial-match hold-back costs up
# to its length squared per delta, so it stays short (stop strings are words or markers, not texts).
MAX_STOP_CHARS = 256
MAX_PROMPTS = 64       # a prompt list: no more than prompts x n allows (params.MAX_GENERATIONS, n = 1)
# Chat messages. The template's cost grows with them (SmolLM2's: 0.14 s for 4096 two-word messages
# here, off the event loop); past 4096 even two-word messages need 30,000+ tokens of context.
MAX_MESSAGES = 4096
MAX_TOOLS = 128        # the OpenAI API's own limits; raypd rejects tools and ignores metadata anyway
MAX_METADATA = 16


def _items(n: int | None = None):
    """A list's bounds: at most `n` items, and validation stops at the first bad one."""
    return Field(max_length=n, fail_fast=True)


TokenIds = Annotated[list[int], _items()]
StopString = Annotated[str, Field(max_length=MAX_STOP_CHARS)]


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")


class StreamOptions(_Strict):
    include_usage: bool = False


class TextPart(_Strict):
    type: Literal["text"]
    text: str


class OtherPart(BaseModel):
    """Any other content part (image_url, input_audio, ...): accepted by the schema so the ingress
    can answer 'only text content is supported' instead of a schema error."""
    model_config = ConfigDict(strict=True, extra="allow")
    type: str


class ChatMessage(_Strict):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | Annotated[list[TextPart | OtherPart], _items()] | None = None
    name: str | None = None
    tool_call_id: str | None = None
    tool_calls: Annotated[list[dict[str, Any]], _items()] | None = None


class ResponseFormat(_Strict):
    type: str
    json_schema: dict[str, Any] | None = None


class _SamplingFields(_Strict):
    """What chat and completions requests share."""
    model: str
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: Annotated[int, Field(ge=1, le=MAX_N)] = 1
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    seed: Seed | None = None
    stop: StopString | Annotated[list[StopString], _items(MAX_STOP_STRINGS)] | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logit_bias: dict[str, float] | None = None
    user: str | None = None
    # Extensions in the style of vLLM's OpenAI server: the engine supports them, and tests need
    # ignore_eos to hold a request open.
    top_k: Annotated[int, Field(ge=-1, le=2**31 - 1)] | None = None  # the sampler builds an int64 tensor of it
    min_p: float | None = None
    repetition_penalty: float | None = None
    stop_token_ids: Annotated[list[int], _items(64)] | None = None
    ignore_eos: bool = False
    # vLLM's scheduling priority: lower is more urgent; unset is 0 (engine/scheduler.py).
    priority: Annotated[int, Field(ge=-(2**31 - 1), le=2**31 - 1)] | None = None


class ChatCompletionRequest(_SamplingFields):
    messages: Annotated[list[ChatMessage], Field(min_length=1, max_length=MAX_MESSAGES, fail_fast=True)]
    max_completion_tokens: int | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = None
    response_format: ResponseFormat | None = None
    tools: Annotated[list[dict[str, Any]], _items(MAX_TOOLS)] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    store: bool | None = None
    metadata: Annotated[dict[str, str], Field(max_length=MAX_METADATA)] | None = None
    service_tier: str | None = None


class CompletionRequest(_SamplingFields):
    # A string, token ids, a batch of token-id lists or a batch of strings (as the OpenAI API). Token
    # ids come first: a union tries its members in order, and ids are the one long list a body holds.
    prompt: str | TokenIds | Annotated[list[TokenIds], _items(MAX_PROMPTS)] | Annotated[list[str], _items(MAX_PROMPTS)]
    logprobs: int | None = None
    echo: bool = False
    suffix: str | None = None
    best_of: int | None = None
