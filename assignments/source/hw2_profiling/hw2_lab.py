"""Assignment 2's workbench: a deliberately slow training pipeline, its data, and the small models the tests train.

Read it and profile it, but do not edit it: the autograder grades your notebook
against its own copy of this file.
"""
from __future__ import annotations

import contextlib
import io
import math
from typing import Callable, Iterable

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image
from torch import nn
from torch.utils.data import DataLoader, Dataset

from helpers.core import kernels_replaced, time_once
from helpers.training import PAD, SequenceData, pad_to

# ---------------------------------------------------------------- Part 1: images stored as PNG files

STORED_PIXELS = 96  # the images on "disk"
TRAIN_PIXELS = 32  # what the model sees
CLASSES = 10
CHANNEL_MEAN = torch.tensor([0.5, 0.5, 0.5]).view(3, 1, 1)
CHANNEL_STD = torch.tensor([0.25, 0.25, 0.25]).view(3, 1, 1)


def _draw_image(label: int, rng: np.random.Generator) -> np.ndarray:
    """A STORED_PIXELS-square RGB image: a square of the label's colour on a noisy grey background."""
    image = rng.integers(96, 160, (STORED_PIXELS // 8, STORED_PIXELS // 8, 3), dtype=np.uint8)
    image = np.kron(image, np.ones((8, 8, 1), dtype=np.uint8))
    colour = np.array([(label * 97) % 256, (label * 53 + 80) % 256, (label * 29 + 160) % 256], dtype=np.uint8)
    side = int(rng.integers(24, 48))
    top, left = rng.integers(0, STORED_PIXELS - side, 2)
    image[top : top + side, left : left + side] = colour
    return image


def _png(image: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(image).save(buffer, format="PNG")
    return buffer.getvalue()


class EncodedImages(Dataset):
    """Images kept as PNG bytes, as they would be on disk; every access decodes and resizes one image."""

    def __init__(self, blobs: list[bytes], labels: torch.Tensor):
        self.blobs, self.labels = blobs, labels

    def __len__(self) -> int:
        return len(self.blobs)

    def decode(self, index: int) -> torch.Tensor:
        """Image ``index`` as a uint8 tensor [3, TRAIN_PIXELS, TRAIN_PIXELS]: PNG decoding plus a resize, the costly part."""
        image = Image.open(io.BytesIO(self.blobs[index])).convert("RGB").resize((TRAIN_PIXELS, TRAIN_PIXELS), Image.BILINEAR)
        return torch.from_numpy(np.array(image)).permute(2, 0, 1).contiguous()

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        return normalize(self.decode(index)), self.labels[index]


def make_encoded_images(n: int = 1024, seed: int = 0) -> EncodedImages:
    """``n`` labelled synthetic images (class = colour of a square), PNG-encoded."""
    rng = np.random.default_rng(seed)
    labels = torch.from_numpy(rng.integers(0, CLASSES, n))
    return EncodedImages([_png(_draw_image(int(label), rng)) for label in labels], labels)


def normalize(images: torch.Tensor) -> torch.Tensor:
    """uint8 images [..., 3, H, W] -> float32, scaled to [0, 1] and standardised per channel."""
    return (images.float() / 255 - CHANNEL_MEAN.to(images.device)) / CHANNEL_STD.to(images.device)


def make_image_model(seed: int = 0) -> nn.Module:
    """A small classifier of TRAIN_PIXELS-square RGB images, initialised from ``seed``."""
    torch.manual_seed(seed)
    return nn.Sequential(nn.Flatten(), nn.Linear(3 * TRAIN_PIXELS**2, 64), nn.ReLU(), nn.Linear(64, CLASSES))


def train_slow(model: nn.Module, dataset: EncodedImages, epochs: int = 1, batch_size: int = 64, lr: float = 0.05, device=None) -> list[float]:
    """Plain SGD over ``dataset`` in order (no shuffling); returns the mean loss of each epoch. Correct, and slow."""
    device = torch.device(device or "cpu")
    model.to(device)
    loader = DataLoader(dataset, batch_size=batch_size)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    epoch_losses = []
    for _ in range(epochs):
        losses = []
        for images, labels in loader:
            images, labels = images.to(device), labels.to(device)
            optimizer.zero_grad(set_to_none=False)
            loss = F.cross_entropy(model(images), labels)
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
            if not np.isfinite(losses[-1]):
                raise FloatingPointError(f"the loss diverged: {losses[-1]}")
        epoch_losses.append(sum(losses) / len(losses))
    return epoch_losses


# ---------------------------------------------------------------- Part 2: sequences of varying length


class TokenClassifier(nn.Module):
    """Embeds every token, transforms each with a small MLP, averages over each sequence's real tokens, classifies.

    Its cost grows with the number of positions in a batch, padded or not. Two layouts:
    ``model(tokens, lengths)`` for padded rows, one sequence per row; ``model(tokens, segments=segments)``
    for packed rows, where ``segments[r, c]`` is the index of the sequence position ``c`` of row ``r``
    belongs to (0, 1, ... across the whole batch) and -1 marks padding.
    """

    def __init__(self, vocab: int, dim: int = 32, classes: int = 2):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim, padding_idx=PAD)
        self.mlp = nn.Sequential(nn.Linear(dim, 2 * dim), nn.ReLU(), nn.Linear(2 * dim, dim))
        self.head = nn.Linear(dim, classes)

    def forward(self, tokens: torch.Tensor, lengths: torch.Tensor | None = None, segments: torch.Tensor | None = None) -> torch.Tensor:
        hidden = self.mlp(self.embed(tokens))
        if segments is not None:
            return self.head(_mean_per_segment(hidden, segments))
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        mask = (positions[None, :] < lengths[:, None]).unsqueeze(-1)
        return self.head((hidden * mask).sum(1) / lengths[:, None])


def _mean_per_segment(hidden: torch.Tensor, segments: torch.Tensor) -> torch.Tensor:
    """[rows, capacity, dim] features and [rows, capacity] segment ids -> [sequences, dim]: the mean over each sequence."""
    real = segments >= 0
    ids, features = segments[real], hidden[real]
    count = int(ids.max()) + 1
    sums = torch.zeros(count, hidden.shape[-1], dtype=hidden.dtype, device=hidden.device).index_add_(0, ids, features)
    return sums / torch.bincount(ids, minlength=count).unsqueeze(1).to(hidden.dtype)


def make_text_model(vocab: int, seed: int = 0) -> TokenClassifier:
    torch.manual_seed(seed)
    return TokenClassifier(vocab, dim=64)


def whole_dataset_padded_batches(data: SequenceData, batch_size: int = 32, seed: int = 0):
    """The slow way: every sequence padded once to the longest in the data set, then random batches of that.

    Yields (tokens [B, longest], lengths [B], labels [B]).
    """
    padded = pad_to(data.tokens, int(data.lengths.max()))
    order = torch.randperm(len(data), generator=torch.Generator().manual_seed(seed))
    for start in range(0, len(data), batch_size):
        batch = order[start : start + batch_size]
        yield padded[batch], data.lengths[batch], data.labels[batch]


def train_epoch(model: nn.Module, optimizer: torch.optim.Optimizer, batches, device=None) -> int:
    """One pass of training over (tokens, lengths, labels) or packed (tokens, segments, labels) batches.

    Returns how many positions were computed on. A 2-D second item is read as packed segments.
    """
    device = torch.device(device or "cpu")
    positions = 0
    for tokens, lengths, labels in batches:
        tokens, lengths, labels = tokens.to(device), lengths.to(device), labels.to(device)
        optimizer.zero_grad(set_to_none=True)
        logits = model(tokens, segments=lengths) if lengths.dim() == 2 else model(tokens, lengths)
        F.cross_entropy(logits, labels).backward()
        optimizer.step()
        positions += tokens.numel()
    return positions


def epoch_seconds(batchings: dict[str, Callable[[], Iterable]], vocab: int, rounds: int = 2, device="cpu") -> dict[str, float]:
    """Seconds of one training epoch of a TokenClassifier over each batching: the fastest of ``rounds``, taken in turns.

    Taking turns and keeping each one's fastest run makes the comparison fair on a busy
    machine (other programs can only slow a run down). On the CPU: one thread, for
    steadier numbers.
    """
    device = torch.device(device)
    models = {name: make_text_model(vocab).to(device) for name in batchings}
    optimizers = {name: torch.optim.Adam(model.parameters(), lr=1e-3) for name, model in models.items()}
    best = {name: math.inf for name in batchings}
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for _ in range(rounds):
            for name, make_batches in batchings.items():
                seconds = time_once(lambda: train_epoch(models[name], optimizers[name], make_batches(), device), sync=device)
                best[name] = min(best[name], seconds)
    finally:
        torch.set_num_threads(threads)
    return best


# ---------------------------------------------------------------- Part 3: a model whose gradients underflow in fp16


def make_regression(n: int = 256, features: int = 32, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Inputs and small targets (about 1e-3) of a smooth regression problem."""
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(n, features, generator=generator)
    w = torch.randn(features, 1, generator=generator)
    return x, torch.tanh(x @ w / features**0.5) * 1e-3


def make_small_output_model(features: int = 32, seed: int = 0) -> nn.Module:
    """An MLP whose last layer starts near zero (as residual branches often do), so its gradients are tiny."""
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(features, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 1))
    with torch.no_grad():
        model[-1].weight.mul_(1e-3)
        model[-1].bias.zero_()
    return model


def regression_loss(model: nn.Module, x: torch.Tensor, y: torch.Tensor, fp16: bool = True) -> torch.Tensor:
    """Mean squared error, the forward pass under fp16 autocast when ``fp16`` (the loss itself in fp32)."""
    device = next(model.parameters()).device
    with torch.autocast(device.type, dtype=torch.float16, enabled=fp16):
        out = model(x.to(device))
    return F.mse_loss(out.float(), y.to(device))


class RecordingSGD(torch.optim.SGD):
    """SGD that keeps a copy of the gradients it was given at its last step (``.seen``) and counts its steps (``.steps``)."""

    steps = 0

    def step(self, closure=None):
        self.seen = [None if p.grad is None else p.grad.detach().clone() for group in self.param_groups for p in group["params"]]
        self.steps += 1
        return super().step(closure)


# The kernels torch.amp.GradScaler runs to unscale and check gradients and to update its scale. Part 3 asks for a scaler
# written without it: while your scaler runs, these ops' kernels refuse, whoever calls them and on whatever thread.
GRAD_SCALER_OPS = frozenset({"_amp_foreach_non_finite_check_and_unscale_", "_amp_update_scale_"})


class GradScalerUsed(AssertionError):
    """Raised when GradScaler's kernels run inside ``forbid_grad_scaler()``."""


def _refusing(op: str):
    def kernel(*args, **kwargs):
        raise GradScalerUsed(f"{op} ran: that is torch.amp.GradScaler's kernel; write the scaling yourself")
    return kernel


@contextlib.contextmanager
def forbid_grad_scaler(*objects):
    """Fail if GradScaler's kernels run inside the block, on any thread, or if any of ``objects`` holds a GradScaler (one level deep)."""
    for obj in objects:
        held = [obj, *vars(obj).values()] if hasattr(obj, "__dict__") else [obj]
        if any(isinstance(value, torch.amp.GradScaler) for value in held):
            raise GradScalerUsed(f"{type(obj).__name__} holds a torch.amp.GradScaler; write the scaling yourself")
    with kernels_replaced({f"aten::{op}": _refusing(op) for op in GRAD_SCALER_OPS}):  # every thread's calls reach these
        yield


def gradients(model: nn.Module) -> list[torch.Tensor]:
    """A copy of every parameter's .grad (None for parameters without one)."""
    return [None if p.grad is None else p.grad.detach().clone() for p in model.parameters()]


def zero_share(grads: list[torch.Tensor]) -> float:
    """Fraction of gradient entries that are exactly zero (underflowed, when the fp32 gradients are not)."""
    return sum(int((g == 0).sum()) for g in grads) / sum(g.numel() for g in grads)


def relative_error(grads: list[torch.Tensor], reference: list[torch.Tensor]) -> float:
    """The largest relative error ||g - r|| / ||r|| over the parameters."""
    return max(float((g.float().cpu() - r.float().cpu()).norm() / r.float().cpu().norm()) for g, r in zip(grads, reference))
