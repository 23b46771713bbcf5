"""Assignment 3's speed race is fair to both sides and reads every answer while its clock runs."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from .grading_support import ROOT

WORKBENCH = ROOT / "assignments" / "source" / "hw3_deployment"

pytestmark = [pytest.mark.grading, pytest.mark.instructor]  # real processes racing, as the autograder runs them, on HW3's workbench


@pytest.fixture(scope="module")
def hw3_lab():
    """The assignment's workbench, as its notebooks import it (sealed: imported only where the key unlocked it)."""
    sys.path.insert(0, str(WORKBENCH))
    import hw3_lab

    return hw3_lab

# Eager PyTorch raced against itself: the student's side runs the very work the baseline's process runs.
SAME_WORK_RACE = """
import json, resource, sys
import torch
if sys.argv[1] == "limited":  # the grading sandbox's CPU-time limit, which makes Linux's process clock lag
    resource.setrlimit(resource.RLIMIT_CPU, (1800, 1805))
sys.path.insert(0, sys.argv[2])
import hw3_lab
model, reference = hw3_lab.served_model(), hw3_lab.served_model()

def same_as_the_baseline(images):
    return tuple(t.numpy() for t in hw3_lab.digits_and_confidence(model, images))

def share_right(images, answer):
    return float((torch.as_tensor(answer[0]) == hw3_lab.digits_and_confidence(reference, images)[0]).float().mean())

print(json.dumps(hw3_lab.race_against_eager(same_as_the_baseline, share_right, batch=64, rounds=60, seed=3)))
"""


@pytest.mark.parametrize("cpu_limit", ["unlimited", "limited"])
def test_the_same_work_on_both_sides_measures_about_1x_with_or_without_a_cpu_limit(cpu_limit):
    done = subprocess.run([sys.executable, "-c", SAME_WORK_RACE, cpu_limit, str(WORKBENCH)], capture_output=True, text=True,
                          timeout=300, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    race = json.loads(done.stdout.strip().splitlines()[-1])
    assert race["agreement"] == 1.0
    assert 0.7 <= race["speedup"] <= 1.2, f"the same work on both sides should measure about 1x, got {race['speedup']:.2f}x: {race}"


class _Later:
    """An answer that computes itself only when it is read."""

    def __init__(self, compute):
        self.compute = compute

    def __getitem__(self, index):
        return self.compute()[index]


def test_an_answer_left_to_compute_when_read_is_refused_with_a_reason(hw3_lab):
    model = hw3_lab.served_model()

    def deferred(images):
        return _Later(lambda: tuple(t.numpy() for t in hw3_lab.digits_and_confidence(model, images)))

    def share_right(images, answer):
        return 1.0
    with pytest.raises(TypeError, match=r"two NumPy arrays; it returned _Later"):
        hw3_lab.race_against_eager(deferred, share_right, rounds=2, seed=4)
