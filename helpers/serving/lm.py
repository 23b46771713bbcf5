"""The served language model: the kit's small transformer LM trained on Python's own standard-library sources.

The text is real and always on the machine: the ``.py`` files of the standard library this Python ships
(``sysconfig``'s ``stdlib`` folder), read in sorted order, so every machine with the same Python trains on
the same corpus. Tokens are bytes (a vocabulary of 256), so no tokenizer has to be trained or downloaded.
Two models are trained once and cached under ``build/serving/lm/``: the *target* and a much smaller *draft*
for speculative decoding; on a GPU both are bigger. The last 5% of the corpus is held out for perplexity.
"""
from __future__ import annotations

import json
import os
import sysconfig
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from helpers.core.device import is_gpu, pick_device
from helpers.core.models import TransformerLM
from helpers.core.paths import build_dir

VOCAB = 256  # bytes
HOLDOUT_SHARE = 0.05

# role -> (model config, at most this many training steps, batch, sequence length, at most this many seconds);
# on a CPU both together train in under 2 minutes (a busy machine gets through fewer steps: LMInfo.steps says)
CONFIGS = {
    ("target", "cpu"): (dict(d_model=96, n_layers=4, n_heads=4, max_len=256), 600, 16, 128, 85.0),
    ("draft", "cpu"): (dict(d_model=32, n_layers=1, n_heads=1, max_len=256), 400, 16, 128, 25.0),
    ("target", "gpu"): (dict(d_model=384, n_layers=8, n_heads=6, max_len=512), 3000, 64, 256, 300.0),
    ("draft", "gpu"): (dict(d_model=128, n_layers=1, n_heads=2, max_len=512), 2000, 64, 256, 100.0),
}
ENV_TRAIN_SECONDS = "EDL_LM_TRAIN_SECONDS"  # overrides the time cap (e.g. a longer run for a better model)


@dataclass(frozen=True)
class LMInfo:
    """How a cached language model was made."""

    role: str
    corpus: str
    corpus_bytes: int
    config: dict
    parameters: int
    steps: int
    train_seconds: float
    trained_on: str
    holdout_loss: float  # nats per byte
    path: str

    @property
    def perplexity(self) -> float:
        import math

        return math.exp(self.holdout_loss)


def corpus_files(limit_bytes: int = 6_000_000) -> list[Path]:
    """The standard library's top-level .py files, sorted, up to about ``limit_bytes``."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    files, total = [], 0
    for path in sorted(stdlib.glob("*.py")):
        files.append(path)
        total += path.stat().st_size
        if total >= limit_bytes:
            break
    if not files:
        raise FileNotFoundError(f"no .py files in the standard library folder {stdlib}: the corpus needs them")
    return files


def python_corpus() -> tuple[torch.Tensor, str]:
    """All corpus bytes as one uint8 tensor, and a sentence saying where they came from."""
    files = corpus_files()
    data = b"".join(p.read_bytes() for p in files)
    where = f"{len(files)} .py files of the Python {sysconfig.get_python_version()} standard library ({files[0].parent})"
    return torch.frombuffer(bytearray(data), dtype=torch.uint8).clone(), where


def split_corpus(data: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(training bytes, held-out bytes): the last 5% is held out."""
    cut = int(len(data) * (1 - HOLDOUT_SHARE))
    return data[:cut], data[cut:]


def encode_text(text: str) -> list[int]:
    return list(text.encode("utf-8"))


def decode_tokens(tokens) -> str:
    return bytes(int(t) for t in tokens).decode("utf-8", errors="replace")


@torch.no_grad()
def holdout_loss(model: torch.nn.Module, data: torch.Tensor, seq_len: int = 128, batches: int = 8, batch: int = 16,
                 seed: int = 1) -> float:
    """Mean next-byte cross-entropy (nats per byte) on ``batches`` x ``batch`` random windows of ``data``."""
    device = next(model.parameters()).device
    g = torch.Generator().manual_seed(seed)
    losses = []
    for _ in range(batches):
        starts = torch.randint(0, len(data) - seq_len - 1, (batch,), generator=g)
        window = torch.stack([data[s:s + seq_len + 1] for s in starts]).long().to(device)
        logits = model(window[:, :-1])
        losses.append(F.cross_entropy(logits.float().reshape(-1, VOCAB), window[:, 1:].reshape(-1)).item())
    return sum(losses) / len(losses)


def train_lm(role: str = "target", device: str | torch.device | None = None, seed: int = 0,
             steps: int | None = None, max_seconds: float | None = None) -> tuple[TransformerLM, LMInfo]:
    """Train the ``role`` model ("target" or "draft") on the corpus with AdamW and a one-cycle schedule.

    It stops after ``steps`` or ``max_seconds``, whichever comes first (the schedule is set for ``steps``).
    """
    device = pick_device(device)
    kind = "gpu" if is_gpu(device) else "cpu"
    config, default_steps, batch, seq_len, default_seconds = CONFIGS[(role, kind)]
    steps = steps or default_steps
    max_seconds = max_seconds or float(os.environ.get(ENV_TRAIN_SECONDS, default_seconds))
    data, where = python_corpus()
    train, held = split_corpus(data)
    torch.manual_seed(seed)
    model = TransformerLM(vocab_size=VOCAB, **config).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3 if kind == "cpu" else 1e-3, weight_decay=0.01)
    schedule = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=optimizer.param_groups[0]["lr"], total_steps=steps,
                                                   pct_start=0.05)
    g = torch.Generator().manual_seed(seed)
    start = time.perf_counter()
    done = 0
    while done < steps and time.perf_counter() - start < max_seconds:
        done += 1
        starts = torch.randint(0, len(train) - seq_len - 1, (batch,), generator=g)
        window = torch.stack([train[s:s + seq_len + 1] for s in starts]).long().to(device)
        loss = F.cross_entropy(model(window[:, :-1]).reshape(-1, VOCAB), window[:, 1:].reshape(-1))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
    seconds = time.perf_counter() - start
    model.eval()
    info = LMInfo(role, where, len(data), config, sum(p.numel() for p in model.parameters()), done, seconds,
                  str(device), holdout_loss(model, held), "")
    return model, info


def model_path(role: str, kind: str) -> Path:
    return build_dir("serving", "lm") / f"{role}-{kind}.pt"


def language_model(role: str = "target", device: str | torch.device | None = None) -> tuple[TransformerLM, LMInfo]:
    """The cached ``role`` model on ``device`` (trained and cached first if there is none): (model in eval mode, info)."""
    if role not in ("target", "draft"):
        raise ValueError(f"role must be 'target' or 'draft', got {role!r}")
    device = pick_device(device)
    kind = "gpu" if is_gpu(device) else "cpu"
    path = model_path(role, kind)
    meta = path.with_suffix(".json")
    if path.exists() and meta.exists():
        info = LMInfo(**json.loads(meta.read_text()))
        model = TransformerLM(vocab_size=VOCAB, **info.config)
        model.load_state_dict(torch.load(path, map_location="cpu", weights_only=True))
        return model.to(device).eval(), info
    model, info = train_lm(role, device)
    info = LMInfo(**{**asdict(info), "path": str(path)})
    tmp = path.with_suffix(".tmp")
    torch.save(model.state_dict(), tmp)
    tmp.replace(path)
    meta.write_text(json.dumps(asdict(info), indent=1))
    return model, info
