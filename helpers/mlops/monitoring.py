"""Lecture 10's checks of a model and its inputs: behavioural tests, data validation, drift alarms measured.

Behavioural tests (after Ribeiro et al.'s CheckList) probe what a model should do rather than its
accuracy: an *invariance* test perturbs inputs in ways that must not change the answer, a *directional*
test in ways that should move it one way, and a *minimum functionality* test asks easy questions. The
drift helpers measure how often ``detect_drift`` raises a false alarm and how often it catches a shift.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch

from helpers.core.report import Report, column
from helpers.mlops.drift import detect_drift


@dataclass
class Behaviour:
    test: str = column("behavioural test")
    kind: str = column("kind")
    passed_share: float = column("inputs that pass", ".2%")
    required: float = column("required", ".0%")
    passed: bool = column("passed")


class BehaviourReport(Report):
    title = "Behavioural tests of the served model"

    @property
    def ok(self) -> bool:
        return all(r.passed for r in self.rows)


def behavioural_tests(model: torch.nn.Module, pixels: torch.Tensor, labels: torch.Tensor, easy: torch.Tensor | None = None,
                      seed: int = 0) -> BehaviourReport:
    """Invariance to faint noise and a one-pixel shift, a directional test (blanking the image), and minimum
    functionality: the ``easy`` digits (a boolean mask chosen without the model, e.g. by a simple baseline's
    margin) must almost all be named correctly (99%). Without ``easy``, all digits at 85% (accuracy, a weaker check)."""
    generator = torch.Generator().manual_seed(seed)

    def share(agrees: torch.Tensor) -> float:
        return agrees.sum().item() / len(agrees)  # exact: 900 of 1,000 is 0.9, not float32's 0.89999998

    with torch.no_grad():
        base = model(pixels).argmax(1)
        noisy = (pixels + 0.02 * torch.randn(pixels.shape, generator=generator)).clamp(0, 1)
        shifted = torch.roll(pixels.view(-1, 28, 28), shifts=1, dims=2).reshape(len(pixels), -1)
        confidence = torch.softmax(model(pixels), 1).max(1).values
        blanked_confidence = torch.softmax(model(pixels * 0.0), 1).max(1).values
        correct = base == labels
    rows = [
        Behaviour("faint noise (sd 0.02) keeps the digit", "invariance", share(model(noisy).argmax(1) == base), 0.98, False),
        Behaviour("a one-pixel shift keeps the digit", "invariance", share(model(shifted).argmax(1) == base), 0.90, False),
        Behaviour("a blank image is less certain than the digit", "directional", share(blanked_confidence < confidence), 0.90, False),
        Behaviour("easy, unambiguous digits are named correctly", "minimum functionality", share(correct[easy]), 0.99, False)
        if easy is not None else
        Behaviour("held-out digits are named correctly (accuracy)", "minimum functionality", share(correct), 0.85, False),
    ]
    for r in rows:
        r.passed = r.passed_share >= r.required
    return BehaviourReport(rows)


@dataclass
class AlarmRate:
    condition: str = column("inputs")
    batches: int = column("batches", ",")
    alarms: int = column("alarms", ",")
    rate: float = column("alarm rate", ".1%")


class AlarmReport(Report):
    """How often the drift detector fires on unshifted batches (false alarms) and on shifted ones (power)."""

    title = "Drift alarms, measured"


def alarm_rates(reference: torch.Tensor, pool: torch.Tensor, shifts: dict[str, Callable[[torch.Tensor], torch.Tensor]],
                features: Callable[[torch.Tensor], np.ndarray] | None = None, batches: int = 50, batch_size: int = 200,
                alpha: float = 0.05) -> AlarmReport:
    """``detect_drift`` of the reference against ``batches`` batches drawn from ``pool``: as they are, and under each shift.

    ``reference`` and ``pool`` must come from the same distribution (e.g. a random split of held-out data);
    ``features`` turns images into the columns tested (default: ``pixel_features``).
    """
    features = features or pixel_features
    reference_features = features(reference)
    rows = []
    for name, shift in {"unshifted (false alarms)": lambda x: x, **shifts}.items():
        alarms = 0
        for seed in range(batches):
            pick = torch.randperm(len(pool), generator=torch.Generator().manual_seed(seed))[:batch_size]
            alarms += detect_drift(reference_features, features(shift(pool[pick])), alpha=alpha).drifted
        rows.append(AlarmRate(name, batches, int(alarms), alarms / batches))
    return AlarmReport(rows, [f"alpha = {alpha:g} family-wise over {reference_features.shape[1]} features; batches of "
                              f"{batch_size} against a reference of {len(reference):,}."])


def random_split(pixels: torch.Tensor, first: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Two disjoint random parts of ``pixels`` (the first of size ``first``): same distribution, no overlap."""
    order = torch.randperm(len(pixels), generator=torch.Generator().manual_seed(seed))
    return pixels[order[:first]], pixels[order[first:]]


def pixel_features(pixels: torch.Tensor) -> np.ndarray:
    """Five summary features per image for drift tests (784 raw pixels would need a large batch per test): the mean
    brightness of each half of the image (top, bottom, left, right) and the mean step between neighbouring pixels
    along a row, which grows with the strokes' edges."""
    images = pixels.view(-1, 28, 28)
    halves = [images[:, :14], images[:, 14:], images[:, :, :14], images[:, :, 14:]]
    steps = (images[:, :, 1:] - images[:, :, :-1]).abs()
    return torch.stack([half.mean((1, 2)) for half in halves] + [steps.mean((1, 2))], 1).numpy()


FEATURE_NAMES = ["top-half brightness", "bottom-half brightness", "left-half brightness", "right-half brightness", "edge strength"]
