"""The networks the lectures profile and train: LeNet (the lecture's variant), a one-hidden-layer MLP, and the
original two-GPU AlexNet of Krizhevsky et al. (2012), whole or split into its two towers.
"""
from __future__ import annotations

from collections import OrderedDict
from typing import Sequence

import torch
from torch import nn


class LeNet(nn.Module):
    """LeNet as the hardware lecture uses it, for 1x28x28 inputs.

    conv 1->6 5x5, ReLU, max-pool 2, conv 6->16 5x5, ReLU, max-pool 2, then linear
    256->120->60->10 with a ReLU after every linear layer, the last one included.
    """

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


def count_parameters(model: nn.Module) -> int:
    """Number of scalar parameters (trainable or not)."""
    return sum(p.numel() for p in model.parameters())
