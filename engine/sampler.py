"""Turn the logits of the sampling tokens into next tokens.

Penalties first (repetition as in Hugging Face, over prompt and output; presence and frequency as
in OpenAI, over output), then greedy rows take the argmax. Other rows apply temperature, top-k,
top-p and min-p, and draw with the exponential-race trick (argmax of p / E, E ~ Exp(1)) using the
request's own torch.Generator, so a seeded request draws the same noise whether it runs alone or
in a batch.
"""
from __future__ import annotations

import torch

from raypd.engine.request import Request


class Sampler:
    def __init__(self, device: torch.device, seed: int = 0):
        self.device = device
        self._generators: dict[str, torch.Generator] = {}
        self._seed_source = torch.Generator().manual_seed(seed)

    def release(self, request_id: str) -> None:
        self._generators.pop(request_id, None)

    def sample(self, logits: torch.Tensor, reqs: list[Request]) -> list[int]:
        """logits: [len(reqs), vocab] float32."""
        for row, req in enumerate(reqs):
            if req.params.has_penalties:
                logits[row] = self._penalize(logits[row], req)
        greedy = [r.params.greedy for r in reqs]
        tokens = logits.argmax(dim=-1).tolist()
        if all(greedy):
            return tokens
        rows = [i for i, g in enumerate(greedy) if not g]
        probs = self._filtered_probs(logits[rows], [reqs[i] for i in rows])
        for j, i in enumerate(rows):
            noise = torch.empty(probs.shape[1], device=self.device).exponential_(generator=self._generator(reqs[i]))
            tokens[i] = int((probs[j] / noise).argmax())
        return tokens

    def skip_draw(self, req: Request, vocab_size: int) -> None:
        """Advance the request's generator past one token's noise, as if this sampler had drawn the
        token another engine drew (PD: the prefill node samples the first token with the same seed),
        so a seeded request continues the stream it would have had on one engine."""
        torch.empty(vocab_size, device=self.device).exponential_(generator=self._generator(req))

    def _generator(self, req: Request) -> torch.Generator:
        g = self._generators.get(req.request_id)
        if g is None:
            seed = req.params.seed
            if seed is None:
                seed = int(torch.randint(0, 2**62, (1,), generator=self._seed_source))
            g = torch.Generator(device=self.device).manual_seed(seed)
            self._generators[req.request_id] = g
        return g

    def _penalize(self, row: torch.Tensor, req: Request) -> torch.Tensor:
        p = req.params
        if p.repetition_penalty != 1.0:
            seen = torch.tensor(sorted(set(req.token_ids)), device=row.device, dtype=torch.long)
            vals = row[seen]
            row[seen] = torch.where(vals > 0, vals / p.repetition_penalty, vals * p.repetition_penalty)
        out = req.output_token_ids
        if out and (p.presence_penalty or p.frequency_penalty):
            counts = torch.bincount(torch.tensor(out, device=row.device), minlength=row.shape[0])[:row.shape[0]].float()
            row = row - p.frequency_penalty * counts - p.presence_penalty * (counts > 0).float()
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
