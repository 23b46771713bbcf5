"""The two stages of lecture 9's DVC pipeline: ``python -m helpers.mlops.pipeline_stages prepare|train``.

Each reads its parameters from params.yaml in the working folder (DVC's convention) and writes only the
outputs dvc.yaml declares, so DVC can tell from hashes what must run again.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import yaml


def params(stage: str) -> dict:
    return yaml.safe_load(Path("params.yaml").read_text())[stage]


def prepare() -> None:
    """A fixed-seed subset of the training digits -> data/digits.pt."""
    from helpers.core import load_digits
    from helpers.serving import flat_pixels

    digits = load_digits(train=True).sample(params("prepare")["subset"], seed=0)
    Path("data").mkdir(exist_ok=True)
    torch.save({"pixels": flat_pixels(digits.images), "labels": digits.labels.long()}, "data/digits.pt")


def train() -> None:
    """An MLP on data/digits.pt -> model.pt and metrics.json (held-out accuracy)."""
    from helpers.serving import ServedMLP, mnist_holdout

    settings = params("train")
    data = torch.load("data/digits.pt")
    torch.manual_seed(0)
    model = ServedMLP(settings["hidden"])
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    for _ in range(settings["epochs"]):
        for start in range(0, len(data["labels"]), 64):
            optimizer.zero_grad()
            torch.nn.functional.cross_entropy(model(data["pixels"][start:start + 64]), data["labels"][start:start + 64]).backward()
            optimizer.step()
    pixels, labels = mnist_holdout()
    with torch.no_grad():
        accuracy = (model(pixels).argmax(1) == labels).float().mean().item()
    torch.save(model.state_dict(), "model.pt")
    Path("metrics.json").write_text(json.dumps({"holdout_accuracy": accuracy}))


if __name__ == "__main__":
    stages = {"prepare": prepare, "train": train}
    if len(sys.argv) != 2 or sys.argv[1] not in stages:
        sys.exit(f"usage: python -m helpers.mlops.pipeline_stages {'|'.join(stages)}")
    stages[sys.argv[1]]()
