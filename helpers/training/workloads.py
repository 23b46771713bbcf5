"""Small programs with a known performance problem, for the profilers to find.

Each ``make_*`` function returns a ``Program``: a step to run repeatedly, and the same work written the fixed way.
``python -m helpers.training.workloads NAME --seconds S`` runs one in a process of its own (for py-spy to attach to).
"""
from __future__ import annotations

import argparse
import io
import sys
import time
from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch
from PIL import Image
from torch import nn

from helpers.core.device import DTYPES, fast_dtypes, is_gpu, pick_device
from helpers.training.data_pipelines import synthetic_images


@dataclass
class Program:
    """A step with a performance pattern, and the step rewritten to fix it."""

    name: str
    expected: str  # the pattern this program reproduces
    step: Callable[[], object]
    fixed: Callable[[], object]
    fix: str


def make_compute_bound(device: torch.device, n: int | None = None) -> Program:
    """A few large matmuls per step: the processor is busy with useful arithmetic. Fix: a faster format, if the hardware has one."""
    n = n or (8192 if is_gpu(device) else 1024)
    a, b = torch.randn(n, n, device=device), torch.randn(n, n, device=device)
    faster = next((d for d in ("bf16", "fp16") if d in fast_dtypes(device)), None)

    def step():
        return ((a @ b).relu() @ b).relu() @ b

    def fixed():
        if faster is None:  # no faster format here: the fix is the step itself
            return step()
        with torch.autocast(device.type, dtype=DTYPES[faster]):
            return step()

    fix = f"{faster} autocast (cheaper arithmetic where the hardware has it)" if faster else "none here: no faster format on this hardware"
    return Program("compute bound: three large matmuls", "compute bound", step, fixed, fix)


def tiny_mlp(width: int = 32, depth: int = 6) -> nn.Sequential:
    """A deep, narrow MLP: every layer is a handful of tiny ops."""
    layers = []
    for _ in range(depth):
        layers += [nn.Linear(width, width), nn.LayerNorm(width), nn.GELU()]
    return nn.Sequential(*layers)


def make_launch_bound(device: torch.device, samples: int = 64, width: int = 32) -> Program:
    """A tiny MLP applied to one sample at a time: hundreds of microsecond-sized ops. Fix: one call on the whole batch."""
    model = tiny_mlp(width).to(device)
    batch = torch.randn(samples, width, device=device)

    @torch.no_grad()
    def step():
        return [model(row.unsqueeze(0)) for row in batch]

    @torch.no_grad()
    def fixed():
        return model(batch)

    return Program("launch bound: a tiny MLP, one sample at a time", "launch bound", step, fixed, "batch the samples into one call")


def make_sync_bound(device: torch.device, batch: int = 32, dim: int = 128, vocab: int = 1000, length: int = 24, check_every: int = 8) -> Program:
    """Greedy decoding that reads every new token back to the host. Fix: keep tokens on the device.

    Each step depends on the previous one, and the host waits for every token
    (``.item()`` to test for the end, ``.tolist()`` to look up words) before it
    sends the next input: host and device take turns. The fix keeps the tokens on
    the device, tests for the end every ``check_every`` tokens and reads the
    tokens once at the end.
    """
    torch.manual_seed(0)
    embed, cell, head = nn.Embedding(vocab, dim).to(device), nn.GRUCell(dim, dim).to(device), nn.Linear(dim, vocab).to(device)
    words = [f"word{i}" for i in range(vocab)]  # the host-side vocabulary
    ids = {word: i for i, word in enumerate(words)}
    end_token = 0

    @torch.no_grad()
    def step():
        state = torch.zeros(batch, dim, device=device)
        tokens = torch.full((batch,), 1, dtype=torch.long, device=device)
        texts: list[list[str]] = [[] for _ in range(batch)]
        for _ in range(length):
            state = cell(embed(tokens), state)
            tokens = head(state).argmax(-1)
            if (tokens == end_token).all().item():  # the host waits for the device here...
                break
            for text, i in zip(texts, tokens.tolist()):  # ...and here
                text.append(words[i])
            tokens = torch.tensor([ids[t[-1]] for t in texts], device=device)  # the device waits for the host
        return texts

    @torch.no_grad()
    def fixed():
        state = torch.zeros(batch, dim, device=device)
        tokens = torch.full((batch,), 1, dtype=torch.long, device=device)
        generated = []
        for position in range(length):
            state = cell(embed(tokens), state)
            tokens = head(state).argmax(-1)
            generated.append(tokens)
            if position % check_every == check_every - 1 and (tokens == end_token).all().item():
                break
        return [[words[i] for i in row] for row in torch.stack(generated, 1).tolist()]  # one read at the end

    return Program("synchronisation bound: greedy decoding, every token read by the host", "synchronisation bound", step, fixed,
                   f"keep tokens on the device; test for the end every {check_every} tokens")


def make_input_pipeline(images: int = 16, size: int = 256, width: int = 8) -> Callable[[], object]:
    """A small model's training step whose batch is decoded from PNG bytes first, as a naive Dataset does."""
    blobs = []
    for image in synthetic_images(images, size):
        buffer = io.BytesIO()
        Image.fromarray(image).save(buffer, "PNG")
        blobs.append(buffer.getvalue())
    model = nn.Sequential(nn.Conv2d(3, width, 5, stride=4), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(width, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)

    def decode_batch() -> torch.Tensor:
        pixels = [np.asarray(Image.open(io.BytesIO(b)).convert("RGB")) for b in blobs]
        return torch.from_numpy(np.stack(pixels)).permute(0, 3, 1, 2).float().div(255)

    def train_step(batch: torch.Tensor) -> None:
        optimizer.zero_grad(set_to_none=True)
        model(batch).logsumexp(1).mean().backward()
        optimizer.step()

    def step():
        train_step(decode_batch())

    return step


WORKLOADS = {"input_pipeline": lambda: make_input_pipeline(), "launch_bound": lambda: make_launch_bound(pick_device("cpu")).step}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m helpers.training.workloads", description="run a workload for a while (for py-spy to attach to)")
    parser.add_argument("name", choices=sorted(WORKLOADS))
    parser.add_argument("--seconds", type=float, default=3.0)
    args = parser.parse_args(argv)
    step = WORKLOADS[args.name]()
    step()
    _run_for(step, args.seconds)
    return 0


def _run_for(step: Callable[[], object], seconds: float) -> None:
    """Call ``step`` repeatedly for ``seconds`` (profilers look for this frame to skip start-up)."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        step()


if __name__ == "__main__":
    sys.exit(main())
