"""Assignment 3's speed race is fair to both sides and reads every answer while its clock runs."""
from __future__ import annotations

import sys

import pytest
import torch

from .grading_support import ROOT

sys.path.insert(0, str(ROOT / "assignments" / "source" / "hw3_deployment"))
import hw3_lab  # noqa: E402  (the assignment's workbench, as its notebooks import it)

pytestmark = pytest.mark.grading  # real processes racing, as the autograder runs them


def _share_right(images, answer):
    want, _ = hw3_lab.digits_and_confidence(hw3_lab.served_model(), images)
    return float((torch.as_tensor(answer[0]) == want).float().mean())


def test_eager_pytorch_run_by_the_student_ties_with_the_baseline_and_stays_under_the_bar():
    model = hw3_lab.served_model()

    def same_as_the_baseline(images):
        return tuple(t.numpy() for t in hw3_lab.digits_and_confidence(model, images))
    race = hw3_lab.race_against_eager(same_as_the_baseline, _share_right, batch=64, rounds=60, seed=3)
    assert race["agreement"] == 1.0
    assert 0.7 <= race["speedup"] <= 1.2, f"the same work on both sides should measure about 1x, got {race['speedup']:.2f}x"


class _Later:
    """An answer that computes itself only when it is read."""

    def __init__(self, compute):
        self.compute = compute

    def __getitem__(self, index):
        return self.compute()[index]


def test_an_answer_left_to_compute_when_read_is_refused_with_a_reason():
    model = hw3_lab.served_model()

    def deferred(images):
        return _Later(lambda: tuple(t.numpy() for t in hw3_lab.digits_and_confidence(model, images)))
    with pytest.raises(TypeError, match=r"two NumPy arrays; it returned _Later"):
        hw3_lab.race_against_eager(deferred, _share_right, rounds=2, seed=4)
