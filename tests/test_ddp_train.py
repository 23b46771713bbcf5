"""The DDP training script: it trains under torchrun (loss goes down, ranks end with identical weights)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from helpers.ddp_train import load_training_data, main

ROOT = Path(__file__).resolve().parents[1]
TORCHRUN = Path(sys.executable).parent / "torchrun"


def test_two_processes_train_under_torchrun_and_agree_on_the_weights():
    result = subprocess.run(
        [str(TORCHRUN), "--standalone", "--nproc_per_node=2", "-m", "helpers.ddp_train", "--epochs", "2"],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    summary = json.loads(next(line for line in result.stdout.splitlines() if line.startswith("SUMMARY ")).removeprefix("SUMMARY "))
    assert summary["world_size"] == 2 and summary["backend"] == "gloo"
    assert summary["ranks_agree"] is True
    losses = summary["losses"]
    assert len(losses) == 2 and losses[1] < 0.8 * losses[0], losses


def test_the_data_function_falls_back_to_learnable_synthetic_digits():
    dataset, source = load_training_data(500, download=False)
    images, labels = dataset.tensors
    assert images.shape == (500, 1, 28, 28) and labels.shape == (500,)
    assert set(labels.tolist()) == set(range(10))
    if "synthetic" in source:  # classes differ: the mean image of two classes is far apart
        assert (images[labels == 0].mean(0) - images[labels == 1].mean(0)).abs().mean() > 0.3
    again, _ = load_training_data(500, download=False)
    assert torch.equal(again.tensors[0], images), "every rank must build the same data"


def test_without_torchrun_the_script_says_how_to_start_it(capsys, monkeypatch):
    monkeypatch.delenv("RANK", raising=False)
    with pytest.raises(SystemExit):
        main([])
    assert "torchrun" in capsys.readouterr().err
