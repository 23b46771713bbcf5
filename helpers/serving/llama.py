"""The Llama architecture SmolLM2 uses, over a paged KV cache: RMSNorm, rotary embeddings, grouped-query attention,
SwiGLU. Lecture 8b writes these definitions in its cells (tests/test_hardware_lecture_code.py keeps the two
identical); the engine and ``make serve-llm`` run this copy.

One forward pass takes a ``Batch``: the new tokens of several sequences laid end to end (a prompt chunk of one, one
token of each decoding sequence, a few draft tokens of another), with where each sequence's keys and values live in
the pool (its block table, turned into slot numbers). Linear layers run over all new tokens at once; attention reads
each sequence's own keys and values back through its slots.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from helpers.serving.smollm import LlamaConfig, cached_weights


class RMSNorm(nn.Module):
    """x / sqrt(mean(x^2) + eps) * weight: LayerNorm without the mean and the bias, computed in fp32."""

    def __init__(self, width: int, eps: float):
        super().__init__()
        self.weight, self.eps = nn.Parameter(torch.ones(width)), eps

    def forward(self, x):                                             # x: (tokens, width)
        x32 = x.float()
        normed = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * normed.to(x.dtype)


def rotary_angles(positions, head_dim, base):
    """cos and sin of position / base^(2i/d) for each position and pair i: (tokens, 1, head_dim / 2) each."""
    half = head_dim // 2
    inv_freq = 1.0 / base ** (torch.arange(0, half, device=positions.device, dtype=torch.float32) / half)   # (half,)
    angles = positions[:, None].float() * inv_freq                    # (tokens, half)
    return angles.cos()[:, None, :], angles.sin()[:, None, :]         # (tokens, 1, half): the same for every head


def rotary(x, cos, sin):
    """Rotate pair (i, i + d/2) of every head by its angle: q.k then depends on the distance between positions only."""
    half = x.shape[-1] // 2                                           # x: (tokens, heads, head_dim)
    x1, x2 = x[..., :half].float(), x[..., half:].float()
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).to(x.dtype)


@dataclass
class Group:
    """Sequences of a batch with the same number Q of new tokens, whose attention runs as one call."""

    read_slots: torch.Tensor    # (B, L) slots of each sequence's keys, positions 0..L-1 (padding reads slot 0)
    query_rows: torch.Tensor    # (B, Q) row in the batch's tokens of each sequence's q-th new token
    mask: torch.Tensor          # (B, 1, Q, L) True where that query may attend to that key


@dataclass
class Batch:
    """One forward pass: sequences, each with some new tokens after the keys and values its cache already holds.

    Decoding sequences (one new token each) form one group; a prompt chunk or a run of drafts its own: no sequence
    is padded to another's number of new tokens."""

    tokens: torch.Tensor        # (T,) the new tokens of every sequence, end to end
    positions: torch.Tensor     # (T,) each one's position in its own sequence
    write_slots: torch.Tensor   # (T,) pool slot each one's key and value go to
    groups: list[Group]
    logit_rows: torch.Tensor    # rows of `tokens` whose next-token logits are wanted

    @classmethod
    def build(cls, sequences, block_size, all_logits=(), device="cpu"):
        """``sequences``: (block table, tokens already cached, new tokens) each; ``all_logits``: indices of sequences
        that want logits at every new token (speculative verification), the rest at their last new token only."""
        tokens, positions, write, logit_rows, by_width = [], [], [], [], {}
        for b, (table, start, new) in enumerate(sequences):
            span = torch.arange(start + len(new))
            slots = torch.tensor(table)[span // block_size] * block_size + span % block_size   # the block table at work
            rows = list(range(len(tokens), len(tokens) + len(new)))
            tokens += new
            positions += range(start, start + len(new))
            write += slots[start:].tolist()
            logit_rows += rows if b in all_logits else rows[-1:]
            by_width.setdefault(len(new), []).append((slots, start, rows))
        groups = []
        for width, members in by_width.items():
            longest = max(len(slots) for slots, _, _ in members)
            starts = torch.tensor([start for _, start, _ in members])
            query_at = starts[:, None] + torch.arange(width)            # (B, Q) position of each new token
            mask = torch.arange(longest) <= query_at[:, None, :, None]   # (B, 1, Q, L) causal: itself and before it
            reads = torch.stack([F.pad(slots, (0, longest - len(slots))) for slots, _, _ in members])   # (B, L)
            groups.append(Group(reads.to(device), torch.tensor([rows for _, _, rows in members], device=device),
                                mask.to(device)))

        def tensor(values):
            return torch.tensor(values, device=device)

        return cls(tensor(tokens), tensor(positions), tensor(write), groups, tensor(logit_rows))


class Attention(nn.Module):
    """Grouped-query attention: `heads` query heads share `kv_heads` key/value heads (9 and 3 in SmolLM2)."""

    def __init__(self, config: LlamaConfig):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = config.heads, config.kv_heads, config.head_dim
        self.q = nn.Linear(config.width, config.heads * config.head_dim, bias=False)
        self.k = nn.Linear(config.width, config.kv_heads * config.head_dim, bias=False)
        self.v = nn.Linear(config.width, config.kv_heads * config.head_dim, bias=False)
        self.o = nn.Linear(config.heads * config.head_dim, config.width, bias=False)

    def forward(self, x, batch, rope, k_pool, v_pool):               # x: (T, width); pools: (slots, kv_heads, head_dim)
        T = x.shape[0]
        q = rotary(self.q(x).view(T, self.heads, self.head_dim), *rope)      # (T, heads, head_dim)
        k = rotary(self.k(x).view(T, self.kv_heads, self.head_dim), *rope)   # (T, kv_heads, head_dim)
        v = self.v(x).view(T, self.kv_heads, self.head_dim)                  # (T, kv_heads, head_dim)
        k_pool[batch.write_slots], v_pool[batch.write_slots] = k, v    # into the pool, where the block tables say
        out = torch.empty_like(q)                                      # (T, heads, head_dim)
        for group in batch.groups:
            keys = k_pool[group.read_slots].transpose(1, 2)            # (B, kv_heads, L, head_dim)
            values = v_pool[group.read_slots].transpose(1, 2)          # (B, kv_heads, L, head_dim)
            queries = q[group.query_rows].transpose(1, 2)              # (B, heads, Q, head_dim)
            attended = F.scaled_dot_product_attention(queries, keys, values, attn_mask=group.mask, enable_gqa=True)
            out[group.query_rows] = attended.transpose(1, 2)           # (B, Q, heads, head_dim) back to their rows
        out = out.view(T, self.heads * self.head_dim)                  # (T, heads * head_dim)
        return self.o(out)


class SwiGLU(nn.Module):
    """The feed-forward block: down(silu(gate(x)) * up(x)), a gated unit instead of one activation."""

    def __init__(self, config: LlamaConfig):
        super().__init__()
        self.gate = nn.Linear(config.width, config.ffn_width, bias=False)
        self.up = nn.Linear(config.width, config.ffn_width, bias=False)
        self.down = nn.Linear(config.ffn_width, config.width, bias=False)

    def forward(self, x):                                             # x: (T, width) -> (T, ffn_width) -> (T, width)
        return self.down(F.silu(self.gate(x)) * self.up(x))


class DecoderLayer(nn.Module):
    """Pre-norm residual block: x + attention(norm(x)), then x + SwiGLU(norm(x))."""

    def __init__(self, config: LlamaConfig):
        super().__init__()
        self.attn_norm, self.attn = RMSNorm(config.width, config.norm_eps), Attention(config)
        self.mlp_norm, self.mlp = RMSNorm(config.width, config.norm_eps), SwiGLU(config)

    def forward(self, x, batch, rope, k_pool, v_pool):
        x = x + self.attn(self.attn_norm(x), batch, rope, k_pool, v_pool)
        return x + self.mlp(self.mlp_norm(x))


class Llama(nn.Module):
    """Token embedding, the decoder layers, a final RMSNorm, and the embedding again as the output layer (tied)."""

    def __init__(self, config: LlamaConfig):
        super().__init__()
        self.config = config
        self.embed = nn.Embedding(config.vocab_size, config.width)
        self.layers = nn.ModuleList(DecoderLayer(config) for _ in range(config.layers))
        self.norm = RMSNorm(config.width, config.norm_eps)

    @torch.no_grad()
    def forward(self, batch, k_cache, v_cache):                       # caches: (layers, slots, kv_heads, head_dim)
        x = self.embed(batch.tokens)                                  # (T, width)
        rope = rotary_angles(batch.positions, self.config.head_dim, self.config.rope_base)   # once for every layer
        for layer, k_pool, v_pool in zip(self.layers, k_cache, v_cache):
            x = layer(x, batch, rope, k_pool, v_pool)
        return F.linear(self.norm(x[batch.logit_rows]), self.embed.weight)   # (wanted rows, vocab)


def load_llm(device: str | torch.device = "cpu", dtype: torch.dtype | None = None) -> Llama:
    """SmolLM2-135M-Instruct on ``device`` (fp32 on a CPU, bf16 on a GPU unless ``dtype`` says), from the kit's cache."""
    device = torch.device(device)
    dtype = dtype or (torch.bfloat16 if device.type == "cuda" else torch.float32)
    tensors, config, _ = cached_weights(dtype)
    with torch.device("meta"):
        model = Llama(config)
    model.load_state_dict(tensors, assign=True, strict=True)
    return model.to(device).eval()
