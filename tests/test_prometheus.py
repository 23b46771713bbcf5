"""The kit's Prometheus rules (promtool), their sped-up copy, and the service's input-drift statistic."""
from __future__ import annotations

import subprocess

import numpy as np
import pytest
import torch
from prometheus_client import CollectorRegistry

from helpers.mlops import InputDriftWindow, sped_up_rules
from helpers.mlops.prometheus import MONITORING, RULES, check_rules, tool

promtool = pytest.mark.skipif(subprocess.run(["sh", "-c", "command -v promtool"], capture_output=True).returncode != 0,
                              reason="promtool is not installed (sudo apt install prometheus)")


@promtool
def test_the_rules_are_valid():
    assert "SUCCESS: 6 rules found" in check_rules(RULES)


@promtool
def test_the_rules_unit_tests_pass_and_a_broken_threshold_fails_them(tmp_path):
    done = subprocess.run([tool("promtool"), "test", "rules", str(MONITORING / "rules_test.yml")], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    (tmp_path / "rules.yml").write_text(RULES.read_text().replace("> 0.05", "> 0.5"))  # errors would never page
    (tmp_path / "rules_test.yml").write_text((MONITORING / "rules_test.yml").read_text())
    broken = subprocess.run([tool("promtool"), "test", "rules", str(tmp_path / "rules_test.yml")], capture_output=True, text=True)
    assert broken.returncode != 0 and "PredictErrorRatioHigh" in broken.stdout + broken.stderr


@promtool
def test_the_sped_up_rules_divide_every_window_and_for(tmp_path):
    fast = sped_up_rules(RULES.read_text(), 12)
    assert "[5s]" in fast and "for: 10s" in fast and "[1m]" not in fast and "for: 2m" not in fast
    (tmp_path / "rules.yml").write_text(fast)
    check_rules(tmp_path / "rules.yml")


def test_the_drift_statistic_stays_under_its_threshold_for_the_same_data_and_crosses_it_for_brighter_inputs():
    from helpers.core import load_digits
    from helpers.serving import flat_pixels

    digits = flat_pixels(load_digits(train=True).images)
    order = torch.randperm(len(digits), generator=torch.Generator().manual_seed(0))
    reference, live = digits[order[:2000]], digits[order[2000:2500]]
    registry = CollectorRegistry()
    window = InputDriftWindow(registry, reference=reference)
    assert registry.get_sample_value("input_drift_ks_statistic") is None, "no statistic from an empty window"
    for start in range(0, 500, 10):
        window.observe(live[start:start + 10])
    same = registry.get_sample_value("input_drift_ks_statistic")
    threshold = registry.get_sample_value("input_drift_ks_threshold")
    assert registry.get_sample_value("input_drift_window_inputs") == 500
    assert 0 < same < threshold
    for start in range(0, 500, 10):
        window.observe((live[start:start + 10] + 0.1).clamp(0, 1))
    assert registry.get_sample_value("input_drift_ks_statistic") > threshold
    assert np.isclose(registry.get_sample_value("input_drift_ks_threshold"), threshold)
