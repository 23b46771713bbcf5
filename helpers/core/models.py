"""The networks the lectures profile and train: LeNet (the lecture's variant), a one-hidden-layer MLP, the
original two-GPU AlexNet of Krizhevsky et al. (2012), whole or split into its two towers, and a small GPT-style
transformer for memory and op-count demos.
"""
from __future__ import annotations

from collections import OrderedDict
from typing import Sequence

import torch
import torch.nn.functional as F
from torch import nn


class LeNet(nn.Module):
    """LeNet as the hardware lecture uses it, for 1x28x28 inputs.

    conv 1->6 5x5, ReLU, max-pool 2, conv 6->16 5x5, ReLU, max-pool 2, then linear
    256->120->60->10 with a ReLU after every linear layer, the last one included.
    """

    input_shape = (1, 28, 28)  # one sample, without the batch dimension

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 6, 5)
        self.relu1 = nn.ReLU()
        self.pool1 = nn.MaxPool2d(2)
        self.conv2 = nn.Conv2d(6, 16, 5)
        self.relu2 = nn.ReLU()
        self.pool2 = nn.MaxPool2d(2)
        self.fc1 = nn.Linear(256, 120)
        self.relu3 = nn.ReLU()
        self.fc2 = nn.Linear(120, 60)
        self.relu4 = nn.ReLU()
        self.fc3 = nn.Linear(60, 10)
        self.relu5 = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.pool1(self.relu1(self.conv1(x)))
        x = self.pool2(self.relu2(self.conv2(x)))
        x = torch.flatten(x, 1)
        x = self.relu3(self.fc1(x))
        x = self.relu4(self.fc2(x))
        return self.relu5(self.fc3(x))


class BasicFCModel(nn.Module):
    """A fully connected classifier for 28x28 images: 784 -> ``num_hidden`` -> 10."""

    input_shape = (1, 28, 28)

    def __init__(self, num_hidden: int = 128):
        super().__init__()
        self.num_hidden = num_hidden
        self.fc1 = nn.Linear(784, num_hidden)
        self.relu = nn.ReLU()
        self.fc2 = nn.Linear(num_hidden, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.relu(self.fc1(torch.flatten(x, 1))))


# ---------------------------------------------------------------- AlexNet (2012)

ALEXNET_INPUT = (3, 227, 227)


def _lrn() -> nn.LocalResponseNorm:
    """Local response normalisation with the paper's constants (n=5, alpha=1e-4, beta=0.75, k=2)."""
    return nn.LocalResponseNorm(size=5, alpha=1e-4, beta=0.75, k=2.0)


def alexnet_2012(split: bool = False, num_classes: int = 1000) -> nn.Module:
    """The original AlexNet (60,965,224 parameters at 1000 classes) for 3x227x227 inputs.

    The paper trained it on two GTX 580 GPUs of 3 GB each, half of every layer's
    kernels on each. ``split=False`` gives one module in which that structure shows
    as ``groups=2`` on conv2, conv4 and conv5 (the layers that only see their own
    GPU's half). ``split=True`` gives the two towers as separate modules
    (``.towers[0]``, ``.towers[1]``) that exchange activations where the paper's
    GPUs did (before conv3, fc6, fc7 and fc8), so each can sit on its own device.
    torchvision's ``alexnet()`` (61,100,840 parameters) is the later one-tower variant.
    """
    return AlexNet2012Split(num_classes) if split else AlexNet2012(num_classes)


class AlexNet2012(nn.Module):
    """AlexNet (2012) as one module; grouped convolutions stand in for the two GPUs."""

    input_shape = ALEXNET_INPUT

    def __init__(self, num_classes: int = 1000):
        super().__init__()
        self.features = nn.Sequential(OrderedDict([
            ("conv1", nn.Conv2d(3, 96, 11, stride=4)),
            ("relu1", nn.ReLU()),
            ("norm1", _lrn()),
            ("pool1", nn.MaxPool2d(3, stride=2)),
            ("conv2", nn.Conv2d(96, 256, 5, padding=2, groups=2)),
            ("relu2", nn.ReLU()),
            ("norm2", _lrn()),
            ("pool2", nn.MaxPool2d(3, stride=2)),
            ("conv3", nn.Conv2d(256, 384, 3, padding=1)),
            ("relu3", nn.ReLU()),
            ("conv4", nn.Conv2d(384, 384, 3, padding=1, groups=2)),
            ("relu4", nn.ReLU()),
            ("conv5", nn.Conv2d(384, 256, 3, padding=1, groups=2)),
            ("relu5", nn.ReLU()),
            ("pool5", nn.MaxPool2d(3, stride=2)),
        ]))
        self.classifier = nn.Sequential(OrderedDict([
            ("drop6", nn.Dropout(0.5)),
            ("fc6", nn.Linear(256 * 6 * 6, 4096)),
            ("relu6", nn.ReLU()),
            ("drop7", nn.Dropout(0.5)),
            ("fc7", nn.Linear(4096, 4096)),
            ("relu7", nn.ReLU()),
            ("fc8", nn.Linear(4096, num_classes)),
        ]))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(torch.flatten(self.features(x), 1))


class AlexNetTower(nn.Module):
    """One GPU's half of AlexNet (2012). Its inputs to conv3, fc6, fc7 and fc8 are both towers' outputs."""

    def __init__(self, num_classes: int = 1000):
        super().__init__()
        if num_classes % 2:
            raise ValueError(f"the split AlexNet halves fc8 between the towers, so num_classes must be even (got {num_classes})")
        self.lower = nn.Sequential(OrderedDict([  # sees only this tower's input channels
            ("conv1", nn.Conv2d(3, 48, 11, stride=4)),
            ("relu1", nn.ReLU()),
            ("norm1", _lrn()),
            ("pool1", nn.MaxPool2d(3, stride=2)),
            ("conv2", nn.Conv2d(48, 128, 5, padding=2)),
            ("relu2", nn.ReLU()),
            ("norm2", _lrn()),
            ("pool2", nn.MaxPool2d(3, stride=2)),
        ]))
        self.upper = nn.Sequential(OrderedDict([  # conv3 reads both towers' conv2 maps
            ("conv3", nn.Conv2d(256, 192, 3, padding=1)),
            ("relu3", nn.ReLU()),
            ("conv4", nn.Conv2d(192, 192, 3, padding=1)),
            ("relu4", nn.ReLU()),
            ("conv5", nn.Conv2d(192, 128, 3, padding=1)),
            ("relu5", nn.ReLU()),
            ("pool5", nn.MaxPool2d(3, stride=2)),
        ]))
        self.fc6 = nn.Sequential(OrderedDict([("drop6", nn.Dropout(0.5)), ("fc6", nn.Linear(2 * 128 * 6 * 6, 2048)), ("relu6", nn.ReLU())]))
        self.fc7 = nn.Sequential(OrderedDict([("drop7", nn.Dropout(0.5)), ("fc7", nn.Linear(2 * 2048, 2048)), ("relu7", nn.ReLU())]))
        self.fc8 = nn.Linear(2 * 2048, num_classes // 2)


class AlexNet2012Split(nn.Module):
    """AlexNet (2012) as two towers; ``place(dev0, dev1)`` puts each on its own device."""

    input_shape = ALEXNET_INPUT

    def __init__(self, num_classes: int = 1000):
        super().__init__()
        self.towers = nn.ModuleList([AlexNetTower(num_classes), AlexNetTower(num_classes)])

    def place(self, *devices: str | torch.device) -> "AlexNet2012Split":
        """Move tower i to ``devices[i]``; forward copies activations between them where the paper's GPUs talked."""
        if len(devices) != 2:
            raise ValueError(f"place() takes one device per tower (2), got {len(devices)}")
        for tower, device in zip(self.towers, devices):
            tower.to(device)
        return self

    def _exchange(self, halves: Sequence[torch.Tensor], dim: int = 1) -> list[torch.Tensor]:
        """Each tower gets both halves, concatenated on its own device."""
        devices = [next(t.parameters()).device for t in self.towers]
        return [torch.cat([h.to(d) for h in halves], dim) for d in devices]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        halves = [t.lower(x.to(next(t.parameters()).device)) for t in self.towers]
        halves = [t.upper(h) for t, h in zip(self.towers, self._exchange(halves))]
        flat = [torch.flatten(h, 1) for h in halves]
        halves = [t.fc6(h) for t, h in zip(self.towers, self._exchange(flat))]
        halves = [t.fc7(h) for t, h in zip(self.towers, self._exchange(halves))]
        logits = [t.fc8(h) for t, h in zip(self.towers, self._exchange(halves))]
        return torch.cat([logits[0], logits[1].to(logits[0].device)], 1)

    @torch.no_grad()
    def load_from(self, whole: AlexNet2012) -> "AlexNet2012Split":
        """Copy the weights of a one-module AlexNet2012 so both compute the same function."""
        f, c = whole.features, whole.classifier
        for i, tower in enumerate(self.towers):
            lo, up = tower.lower, tower.upper
            _copy_rows(lo.conv1, f.conv1, i, 2)
            _copy_rows(lo.conv2, f.conv2, i, 2)  # grouped: tower i's kernels read only its own channels
            _copy_rows(up.conv3, f.conv3, i, 2)  # ungrouped: reads all 256 channels
            _copy_rows(up.conv4, f.conv4, i, 2)
            _copy_rows(up.conv5, f.conv5, i, 2)
            _copy_rows(tower.fc6.fc6, c.fc6, i, 2)  # the towers' flattened halves concatenate in the whole's order
            _copy_rows(tower.fc7.fc7, c.fc7, i, 2)
            _copy_rows(tower.fc8, c.fc8, i, 2)
        return self


def _copy_rows(target: nn.Module, source: nn.Module, part: int, parts: int) -> None:
    """Copy output slice ``part`` of ``parts`` of a layer's weight and bias."""
    rows = source.weight.shape[0] // parts
    target.weight.copy_(source.weight[part * rows:(part + 1) * rows])
    target.bias.copy_(source.bias[part * rows:(part + 1) * rows])


# ---------------------------------------------------------------- a GPT-style transformer

# Named sizes; "1.3b" has 1.34 billion parameters: build it on the meta device (``with torch.device("meta"):``).
TRANSFORMER_SIZES = {
    "tiny": dict(vocab_size=1000, d_model=64, n_layers=2, n_heads=4, max_len=64),
    "small": dict(vocab_size=8000, d_model=256, n_layers=4, n_heads=4, max_len=256),
    "1.3b": dict(vocab_size=32000, d_model=2048, n_layers=24, n_heads=16, max_len=1024),
}


class TransformerBlock(nn.Module):
    """Pre-norm decoder block: causal self-attention, then a 4x-wide MLP, each around a residual connection."""

    def __init__(self, d_model: int, n_heads: int):
        super().__init__()
        if d_model % n_heads:
            raise ValueError(f"d_model ({d_model}) must be a multiple of n_heads ({n_heads})")
        self.n_heads = n_heads
        self.ln1 = nn.LayerNorm(d_model)
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)
        self.ln2 = nn.LayerNorm(d_model)
        self.fc = nn.Linear(d_model, 4 * d_model)
        self.act = nn.GELU()
        self.out = nn.Linear(4 * d_model, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, length, width = x.shape
        heads = [z.view(batch, length, self.n_heads, width // self.n_heads).transpose(1, 2) for z in self.qkv(self.ln1(x)).split(width, dim=2)]
        attended = F.scaled_dot_product_attention(*heads, is_causal=True)
        x = x + self.proj(attended.transpose(1, 2).reshape(batch, length, width))
        return x + self.out(self.act(self.fc(self.ln2(x))))


class TransformerLM(nn.Module):
    """A decoder-only language model: token and position embeddings, ``n_layers`` blocks, a final norm, an untied head."""

    def __init__(self, vocab_size: int = 1000, d_model: int = 64, n_layers: int = 2, n_heads: int = 4, max_len: int = 64):
        super().__init__()
        self.vocab_size, self.max_len = vocab_size, max_len
        self.tok = nn.Embedding(vocab_size, d_model)
        self.pos = nn.Embedding(max_len, d_model)
        self.blocks = nn.ModuleList(TransformerBlock(d_model, n_heads) for _ in range(n_layers))
        self.ln = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab_size, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        if tokens.shape[1] > self.max_len:
            raise ValueError(f"sequence of {tokens.shape[1]} tokens is longer than max_len={self.max_len}")
        x = self.tok(tokens) + self.pos(torch.arange(tokens.shape[1], device=tokens.device))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln(x))

    def example_input(self, batch_size: int = 1, seq_len: int | None = None) -> torch.Tensor:
        """Random token ids of shape (batch_size, seq_len), on the device the model's weights are on."""
        device = self.tok.weight.device
        return torch.randint(0, self.vocab_size, (batch_size, seq_len or self.max_len), device=device)


def transformer_lm(size: str = "tiny", **overrides) -> TransformerLM:
    """A TransformerLM of a named size (``TRANSFORMER_SIZES``), with any field overridden."""
    if size not in TRANSFORMER_SIZES:
        raise ValueError(f"unknown transformer size {size!r}; choose from {sorted(TRANSFORMER_SIZES)}")
    return TransformerLM(**{**TRANSFORMER_SIZES[size], **overrides})


def count_parameters(model: nn.Module) -> int:
    """Number of scalar parameters (trainable or not)."""
    return sum(p.numel() for p in model.parameters())
