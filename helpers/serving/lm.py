"""The served language model: the kit's small transformer LM trained on Python's own standard-library sources.

The text is real and always on the machine: the ``.py`` files of the standard library this Python ships
(``sysconfig``'s ``stdlib`` folder), read in sorted order, so every machine with the same Python trains on
the same corpus; docstrings, comment lines and blank lines are taken out (``code_only``), so a model small
enough to train in a minute learns code rather than English prose. Tokens are bytes (a vocabulary of 256), so
no tokenizer has to be trained or downloaded. Two models are trained once and cached under ``build/serving/lm/``: the *target* and a much smaller *draft*
for speculative decoding; on a GPU both are bigger. The last 5% of the corpus is held out for perplexity.
"""
from __future__ import annotations

import ast
import functools
import json
import math
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

# role -> (model config, at most this many training steps, batch, window length, at most this many seconds, peak
# learning rate). On a CPU both together train in under 2 minutes on one thread (a busy machine gets through fewer
# steps: LMInfo.steps says); the target is the deeper, the draft a quarter of its width.
CONFIGS = {
    ("target", "cpu"): (dict(d_model=64, n_layers=2, n_heads=4, max_len=256), 3000, 16, 64, 85.0, 1e-2),
    ("draft", "cpu"): (dict(d_model=32, n_layers=1, n_heads=2, max_len=256), 2000, 16, 64, 25.0, 1e-2),
    ("target", "gpu"): (dict(d_model=384, n_layers=8, n_heads=6, max_len=512), 3000, 64, 256, 300.0, 1e-3),
    ("draft", "gpu"): (dict(d_model=128, n_layers=1, n_heads=2, max_len=512), 2000, 64, 256, 100.0, 2e-3),
}
CACHE_VERSION = 3  # bumped whenever training changes, so models cached by an older kit are trained again
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


def corpus_files(limit_bytes: int = 8_000_000) -> list[Path]:
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


def code_only(source: str) -> str:
    """``source`` without its docstrings, comment lines and blank lines: the code a small model should learn first."""
    try:
        tree = ast.parse(source)
    except SyntaxError:  # a file this Python cannot parse (a test fixture, say) is left out
        return ""
    drop = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
                and isinstance(body[0].value.value, str):
            drop.update(range(body[0].lineno, body[0].end_lineno + 1))
    kept = [line for number, line in enumerate(source.splitlines(), 1)
            if number not in drop and line.strip() and not line.lstrip().startswith("#")]
    return "\n".join(kept) + "\n"


@functools.lru_cache(maxsize=1)
def _corpus_bytes() -> tuple[bytes, str]:
    files = corpus_files()
    where = (f"{len(files)} .py files of the Python {sysconfig.get_python_version()} standard library ({files[0].parent}), "
             "docstrings, comments and blank lines removed")
    cached = build_dir("serving", "lm") / f"corpus-v{CACHE_VERSION}.py.txt"   # parsing them all takes seconds: once
    if not cached.exists():
        text = "".join(code_only(p.read_text(encoding="utf-8", errors="replace")) for p in files)
        cached.with_suffix(".tmp").write_bytes(text.encode("utf-8"))
        cached.with_suffix(".tmp").replace(cached)
    return cached.read_bytes(), where


def python_corpus() -> tuple[torch.Tensor, str]:
    """All corpus bytes as one uint8 tensor, and a sentence saying where they came from."""
    data, where = _corpus_bytes()
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


def learning_rate(peak: float, progress: float, warmup: float = 0.05) -> float:
    """Linear warm-up over the first ``warmup`` of training, then a cosine down to 5% of ``peak`` at ``progress`` 1."""
    if progress < warmup:
        return peak * (progress + 1e-3) / warmup
    done = min((progress - warmup) / (1 - warmup), 1.0)
    return peak * (0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * done)))


def sinusoids(positions: int, width: int) -> torch.Tensor:
    """(positions, width): sin and cos of position x 10000^(-2i/width), the Transformer paper's position encoding.

    Any fixed offset between two positions is then a rotation of these features, so attention can learn to look a
    few characters back (what a character-level model needs first) in far fewer steps than from random positions.
    """
    position = torch.arange(positions, dtype=torch.float32)[:, None]
    frequency = torch.exp(-math.log(10000.0) * torch.arange(0, width, 2, dtype=torch.float32) / width)
    table = torch.zeros(positions, width)
    table[:, 0::2], table[:, 1::2] = torch.sin(position * frequency), torch.cos(position * frequency)
    return table


def logits_at(model: TransformerLM, tokens: torch.Tensor, first_position: int) -> torch.Tensor:
    """The model's forward pass over ``tokens`` placed at positions ``first_position``, ``first_position + 1``, ..."""
    positions = torch.arange(first_position, first_position + tokens.shape[1], device=tokens.device)
    x = model.tok(tokens) + model.pos(positions)
    for block in model.blocks:
        x = block(x)
    return model.head(model.ln(x))


def train_lm(role: str = "target", device: str | torch.device | None = None, seed: int = 0,
             steps: int | None = None, max_seconds: float | None = None) -> tuple[TransformerLM, LMInfo]:
    """Train the ``role`` model ("target" or "draft") on the corpus with AdamW, a warm-up and a cosine decay.

    It stops after ``steps`` or ``max_seconds``, whichever comes first. The schedule follows whichever is nearer
    its end, so a busy machine that gets through fewer steps still ends at a low learning rate.
    """
    device = pick_device(device)
    kind = "gpu" if is_gpu(device) else "cpu"
    config, default_steps, batch, seq_len, default_seconds, peak = CONFIGS[(role, kind)]
    steps = steps or default_steps
    max_seconds = max_seconds or train_seconds_override() or default_seconds
    data, where = python_corpus()
    train, held = split_corpus(data)
    torch.manual_seed(seed)
    model = TransformerLM(vocab_size=VOCAB, **config).to(device)
    with torch.no_grad():  # learned positions start from the original Transformer's sinusoids (see sinusoids())
        model.pos.weight.copy_(sinusoids(config["max_len"], config["d_model"]))
    optimizer = torch.optim.AdamW(model.parameters(), lr=peak, betas=(0.9, 0.95), weight_decay=0.01)
    g = torch.Generator().manual_seed(seed)
    threads = torch.get_num_threads()
    if kind == "cpu":  # matrices this small gain little from a second thread, and lose much when the cores are busy
        torch.set_num_threads(1)
    start = time.perf_counter()
    done = 0
    while (progress := max(done / steps, (time.perf_counter() - start) / max_seconds)) < 1:
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(peak, progress)
        starts = torch.randint(0, len(train) - seq_len - 1, (batch,), generator=g)
        window = torch.stack([train[s:s + seq_len + 1] for s in starts]).long().to(device)
        # short windows train faster; a random offset per batch trains every position embedding all the same
        first = int(torch.randint(0, config["max_len"] - seq_len + 1, (1,), generator=g))
        logits = logits_at(model, window[:, :-1], first)
        loss = F.cross_entropy(logits.reshape(-1, VOCAB), window[:, 1:].reshape(-1))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        done += 1
    seconds = time.perf_counter() - start
    torch.set_num_threads(threads)
    model.eval()
    info = LMInfo(role, where, len(data), config, sum(p.numel() for p in model.parameters()), done, seconds,
                  str(device), holdout_loss(model, held), "")
    return model, info


def train_seconds_override() -> float | None:
    """The time cap ``$EDL_LM_TRAIN_SECONDS`` sets for every role, or None where it is not set."""
    value = os.environ.get(ENV_TRAIN_SECONDS, "").strip()
    if not value:
        return None
    try:
        seconds = float(value)
    except ValueError:
        seconds = 0.0
    if not seconds > 0:
        raise ValueError(f"${ENV_TRAIN_SECONDS} must be a positive number of seconds, got {value!r}: "
                         f"unset it for the default caps, or give e.g. {ENV_TRAIN_SECONDS}=300")
    return seconds


def model_path(role: str, kind: str) -> Path:
    """Where the ``role`` model is cached; a model trained under a time-cap override is cached apart (``-<s>s``)."""
    override = train_seconds_override()
    budget = "" if override is None else f"-{override:g}s"
    return build_dir("serving", "lm") / f"{role}-{kind}-v{CACHE_VERSION}{budget}.pt"


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
