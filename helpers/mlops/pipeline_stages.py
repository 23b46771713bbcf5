"""The stage of lecture 9's DVC pipeline: ``python -m helpers.mlops.pipeline_stages train``.

It reads its parameters from params.yaml in the working folder (DVC's convention), trains on the
versioned data/digits.pt, and writes only the outputs dvc.yaml declares (model.pt, metrics.json with the
accuracy on the data's own validation rows), so DVC can tell from hashes what must run again.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import yaml


def train() -> None:
    """An MLP on the first 80% of data/digits.pt, scored on the last 20% -> model.pt, metrics.json."""
    from helpers.serving import ServedMLP

    settings = yaml.safe_load(Path("params.yaml").read_text())["train"]
    data = torch.load("data/digits.pt")
    cut = int(0.8 * len(data["labels"]))
    pixels, labels = data["pixels"][:cut], data["labels"][:cut]
    torch.set_num_threads(1)  # a small MLP: a second thread saves little, and stalls whenever another program holds its core
    torch.manual_seed(settings.get("seed", 0))
    model = ServedMLP(settings["hidden"])
    optimizer = torch.optim.Adam(model.parameters(), lr=settings.get("lr", 1e-3))
    for _ in range(settings["epochs"]):
        for start in range(0, len(labels), 64):
            optimizer.zero_grad()
            torch.nn.functional.cross_entropy(model(pixels[start:start + 64]), labels[start:start + 64]).backward()
            optimizer.step()
    with torch.no_grad():
        accuracy = (model(data["pixels"][cut:]).argmax(1) == data["labels"][cut:]).float().mean().item()
    torch.save(model.state_dict(), "model.pt")
    Path("metrics.json").write_text(json.dumps({"val_accuracy": accuracy}))


if __name__ == "__main__":
    if sys.argv[1:] != ["train"]:
        sys.exit("usage: python -m helpers.mlops.pipeline_stages train")
    train()
