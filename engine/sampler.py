"""Turn the logits of the sampling tokens into next tokens.

Penalties first (repetition as in Hugging Face, over prompt and output; presence and frequency as
in OpenAI, over the generated tokens: the output plus the prompt's replayed tail, see
Request.generated_token_ids), then greedy rows take the argmax. Other rows apply temperature,
top-k, top-p and min-p, and draw with the exponential-race trick (argmax of p / E, E ~ Exp(1)).

The noise E is a pure function of (seed, position), where position is the number of tokens before
the one being drawn (len(req.token_ids) at draw time). Before each row's draw the sampler seeds its
one torch.Generator with

    noise_seed(seed, position) = mix64(mix64(seed mod 2**64) + (position + 1) * GAMMA)  (mod 2**64)

that is, output number `position` of a SplitMix64 stream whose state starts at mix64(seed), where
mix64 is SplitMix64's finalizer and GAMMA = 0x9E3779B97F4A7C15. So the noise depends neither on the
batch nor on what this engine drew before nor on which engine draws (on one device type: CPU and
CUDA generators differ), and a request continues its stream wherever a token is drawn: the PD decode
node draws position len(prompt) + 1 after the prefill node drew len(prompt), and a failover replay
whose prompt ends with the k tokens already streamed draws len(original prompt) + k. A request
without a seed gets a random seed from the sampler once, so it is reproducible within its life on
one engine. (The CPU generator keys its Mersenne Twister with the low 32 bits of a seed; the final
mix makes those bits depend on every bit of seed and position.)
"""
from __future__ import annotations

import torch

from raypd.engine.request import Request

_MASK64 = 2**64 - 1
_GAMMA = 0x9E3779B97F4A7C15


def _mix64(z: int) -> int:
    """SplitMix64's finalizer: a bijection on 64-bit integers that spreads every input bit."""
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9 & _MASK64
    z = (z ^ (z >> 27)) * 0x94D049BB133111EB & _MASK64
    return z ^ (z >> 31)


def noise_seed(seed: int, position: int) -> int:
    """The generator seed for the noise of the token at `position` of a request seeded with `seed`."""
    return _mix64((_mix64(seed & _MASK64) + (position + 1) * _GAMMA) & _MASK64)


class Sampler:
    def __init__(self, device: torch.device, seed: int = 0):
        self.device = device
        self._noise_generator = torch.Generator(device=device)  # reseeded before every draw
        self._seed_source = torch.Generator().manual_seed(seed)
        self._drawn_seeds: dict[str, int] = {}  # request id -> the seed drawn for a request without one

    def release(self, request_id: str) -> None:
        self._drawn_seeds.pop(request_id, None)

    def sample(self, logits: torch.Tensor, reqs: list[Request]) -> list[int]:
        """logits: [len(reqs), vocab] float32."""
        for row, req in enumerate(reqs):
            if req.params.has_penalties:
                logits[row] = self._penalize(logits[row], req)
        greedy = [r.params.greedy for r in reqs]
        tokens = self.greedy(logits).tolist()
        if all(greedy):
            return tokens
        rows = [i for i, g in enumerate(greedy) if not g]
        probs = self._filtered_probs(logits[rows], [reqs[i] for i in rows])
        for j, i in enumerate(rows):
            tokens[i] = int((probs[j] / self.noise(reqs[i], probs.shape[1])).argmax())
        return tokens

    @staticmethod
    def defers(reqs: list[Request]) -> bool:
        """Whether these requests' tokens can be drawn on the device without the host (greedy()):
        all greedy, no penalty reading the token history (overlap scheduling, engine/overlap.py)."""
        return all(r.params.greedy and not r.params.has_penalties for r in reqs)

    @staticmethod
    def greedy(logits: torch.Tensor) -> torch.Tensor:
        """The greedy tokens of requests that defers() accepted, left on the device: what sample()
        returns for them, without the host synchronisation."""
        return logits.argmax(dim=-1)

    def noise(self, req: Request, vocab_size: int) -> torch.Tensor:
        """The Exp(1) noise of the request's next draw, at position len(req.token_ids)."""
        self._noise_generator.manual_seed(noise_seed(self._seed(req), req.num_tokens))
        return torch.empty(vocab_size, device=self.device).exponential_(generator=self._noise_generator)

    def _seed(self, req: Request) -> int:
        if req.params.seed is not None:
            return req.params.seed
        seed = self._drawn_seeds.get(req.request_id)
        if seed is None:
            seed = int(torch.randint(0, 2**62, (1,), generator=self._seed_source))
            self._drawn_seeds[req.request_id] = seed
        return seed

    def _penalize(self, row: torch.Tensor, req: Request) -> torch.Tensor:
        p = req.params
        if p.repetition_penalty != 1.0:
            seen = torch.tensor(sorted(set(req.token_ids)), device=row.device, dtype=torch.long)
            vals = row[seen]
            row[seen] = torch.where(vals > 0, vals / p.repetition_penalty, vals * p.repetition_penalty)
        if p.presence_penalty or p.frequency_penalty:
            out = req.generated_token_ids
            if out:
                counts = torch.bincount(torch.tensor(out, device=row.device), minlength=row.shape[0])[:row.shape[0]]
                row = row - p.frequency_penalty * counts.float() - p.presence_penalty * (counts > 0).float()
        return row

    @staticmethod
    def _filtered_probs(logits: torch.Tensor, reqs: list[Request]) -> torch.Tensor:
        temps = torch.tensor([r.params.temperature for r in reqs], device=logits.device).unsqueeze(1)
        probs = torch.softmax(logits / temps, dim=-1)
        top_k = [r.params.top_k for r in reqs]
        top_p = [r.params.top_p for r in reqs]
        if any(k > 0 for k in top_k) or any(p < 1.0 for p in top_p):
            sorted_p, order = probs.sort(dim=-1, descending=True)
            vocab = probs.shape[1]
            ks = torch.tensor([k if k > 0 else vocab for k in top_k], device=logits.device).unsqueeze(1)
            rank = torch.arange(vocab, device=logits.device).unsqueeze(0)
            drop = rank >= ks
            # top-p keeps the smallest head whose mass reaches p: drop a token once the mass before it does.
            mass_before = sorted_p.cumsum(dim=-1) - sorted_p
            drop |= mass_before >= torch.tensor(top_p, device=logits.device).unsqueeze(1)
            drop[:, 0] = False
            sorted_p = sorted_p.masked_fill(drop, 0.0)
            probs = torch.zeros_like(probs).scatter_(1, order, sorted_p)
        min_p = torch.tensor([r.params.min_p for r in reqs], device=logits.device).unsqueeze(1)
        if bool((min_p > 0).any()):
            probs = probs.masked_fill(probs < min_p * probs.max(dim=-1, keepdim=True).values, 0.0)
        return probs / probs.sum(dim=-1, keepdim=True)
