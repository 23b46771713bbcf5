"""Speculative decoding: a small draft model proposes ``k`` tokens, the target checks them all in one call.

Greedy: the proposals are kept up to the first one the target would not have chosen, which is replaced by
the target's own choice, so the output is the target's alone, token for token. Sampling (Leviathan et al.
2023, Chen et al. 2023): a proposal x drawn from the draft's q is kept with probability min(1, p(x)/q(x)),
else the token is drawn from the leftover max(p - q, 0), renormalised; the result is distributed as the
target's p exactly. Both models run here without a KV cache, so a target call costs about the same whether
it checks one token or ``k + 1``: what speculation saves is target calls.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import torch


def resolve(p: torch.Tensor, q: torch.Tensor, proposed: torch.Tensor, uniform: torch.Tensor,
            generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The acceptance rule at one position, for many draws at once: (accepted?, token kept or drawn instead).

    ``p`` and ``q`` are the target's and the draft's next-token probabilities (vocab,), ``proposed`` the draft's
    tokens drawn from ``q`` (n,), ``uniform`` n draws from U(0, 1).
    """
    accepted = uniform < (p[proposed] / q[proposed]).clamp(max=1.0)
    leftover = (p - q).clamp(min=0)
    leftover = leftover / leftover.sum() if leftover.sum() > 0 else p
    redrawn = torch.multinomial(leftover, len(proposed), replacement=True, generator=generator)
    return accepted, torch.where(accepted, proposed, redrawn)


def _probs(model, tokens: list[int], temperature: float, last: int = 1) -> torch.Tensor:
    """Next-token probabilities (or one-hot of the argmax at temperature 0) at the last ``last`` positions."""
    device = model.tok.weight.device
    logits = model(torch.tensor([tokens], device=device))[0, -last:].float()
    if temperature <= 0:
        return torch.nn.functional.one_hot(logits.argmax(-1), logits.shape[-1]).float()
    return torch.softmax(logits / temperature, dim=-1)


@dataclass
class SpeculativeRun:
    tokens: list[int]
    target_calls: int
    draft_calls: int
    proposed: int
    accepted: int
    seconds: float

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / max(self.proposed, 1)

    @property
    def target_calls_per_token(self) -> float:
        return self.target_calls / max(len(self.tokens), 1)


@torch.no_grad()
def target_only(target, prompt: list[int], max_tokens: int, temperature: float = 0.0,
                generator: torch.Generator | None = None) -> SpeculativeRun:
    """The baseline: one target call per token."""
    start, tokens = time.perf_counter(), list(prompt)
    for _ in range(max_tokens):
        p = _probs(target, tokens, temperature)[0]
        tokens.append(int(torch.multinomial(p, 1, generator=generator)) if temperature > 0 else int(p.argmax()))
    return SpeculativeRun(tokens[len(prompt):], max_tokens, 0, 0, 0, time.perf_counter() - start)


@torch.no_grad()
def speculative_decode(target, draft, prompt: list[int], max_tokens: int, k: int = 4, temperature: float = 0.0,
                       generator: torch.Generator | None = None) -> SpeculativeRun:
    """Generate ``max_tokens`` after ``prompt``: the draft proposes ``k`` at a time, one target call checks them."""
    start, tokens = time.perf_counter(), list(prompt)
    target_calls = draft_calls = proposed = accepted = 0
    while len(tokens) - len(prompt) < max_tokens:
        k_now = min(k, max_tokens - (len(tokens) - len(prompt)) - 1)
        guesses, qs = [], []
        for _ in range(k_now):                       # the draft runs ahead, k tokens, one call each
            q = _probs(draft, tokens + guesses, temperature)[0]
            qs.append(q)
            guesses.append(int(torch.multinomial(q, 1, generator=generator)) if temperature > 0 else int(q.argmax()))
            draft_calls += 1
        ps = _probs(target, tokens + guesses, temperature, last=k_now + 1)   # one target call checks them all
        target_calls += 1
        proposed += k_now
        for i, guess in enumerate(guesses):
            if temperature > 0:
                u = torch.rand(1, generator=generator, device=ps.device)
                ok, token = resolve(ps[i], qs[i], torch.tensor([guess], device=ps.device), u, generator)
                ok, token = bool(ok), int(token)
            else:
                token = int(ps[i].argmax())
                ok = token == guess
            tokens.append(token)
            if not ok:
                break
            accepted += 1
        else:  # every guess kept: the target's call also gave the next token
            p = ps[k_now]
            tokens.append(int(torch.multinomial(p, 1, generator=generator)) if temperature > 0 else int(p.argmax()))
    out = tokens[len(prompt):len(prompt) + max_tokens]
    return SpeculativeRun(out, target_calls, draft_calls, proposed, accepted, time.perf_counter() - start)
