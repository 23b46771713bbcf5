"""helpers.mlops.monitoring: behavioural tests that can fail, features for drift, alarm rates that follow the shift."""
from __future__ import annotations

import torch

from helpers.core.data import load_digits
from helpers.mlops import alarm_rates, behavioural_tests, pixel_features, random_split
from helpers.serving import flat_pixels, mnist_holdout, mnist_model


def test_behavioural_tests_pass_a_trained_model_and_fail_an_untrained_one():
    pixels, labels = mnist_holdout(300)
    trained = behavioural_tests(mnist_model()[0], pixels, labels)
    assert trained.find(test="faint noise (sd 0.02) keeps the digit").passed
    untrained = behavioural_tests(torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(784, 10)), pixels, labels)
    assert not untrained.find(kind="minimum functionality").passed


def test_features_are_one_row_per_image_and_see_brightness():
    pixels, _ = mnist_holdout(50)
    plain, brighter = pixel_features(pixels), pixel_features((pixels + 0.1).clamp(0, 1))
    assert plain.shape == (50, 5) and (brighter[:, 0] > plain[:, 0]).all()


def test_alarms_are_rare_without_a_shift_and_frequent_with_one():
    reference, pool = random_split(flat_pixels(load_digits(train=True).images), 1000)
    report = alarm_rates(reference, pool, {"brighter": lambda p: (p + 0.05).clamp(0, 1)}, batches=20)
    assert report.find(condition="unshifted (false alarms)").rate <= 0.2  # alpha 0.05; 20 batches leave room for chance
    assert report.find(condition="brighter").rate >= 0.9
