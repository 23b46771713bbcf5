"""Data and pipeline versioning with DVC: a real git + DVC repository in a temporary folder, reproduced step by step.

``dvc repro`` compares the hashes of each stage's command, dependencies and parameters with those it
recorded in dvc.lock, and runs only the stages whose inputs changed (and what depends on them).
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import yaml

from helpers.core.report import Report, column

STAGE = f"{sys.executable} -m helpers.mlops.pipeline_stages"
PIPELINE = {"stages": {
    "prepare": {"cmd": f"{STAGE} prepare", "params": ["prepare.subset"], "outs": ["data/digits.pt"]},
    "train": {"cmd": f"{STAGE} train", "deps": ["data/digits.pt"], "params": ["train.hidden", "train.epochs"],
              "outs": ["model.pt"], "metrics": [{"metrics.json": {"cache": False}}]},
}}
QUIET_ENV = {"DVC_NO_ANALYTICS": "1", "DVC_NO_UPDATER": "1", "GIT_AUTHOR_NAME": "kit", "GIT_AUTHOR_EMAIL": "kit@localhost",
             "GIT_COMMITTER_NAME": "kit", "GIT_COMMITTER_EMAIL": "kit@localhost"}


def run(command: list[str], folder: Path) -> str:
    """Run ``command`` in ``folder``; its output, or an error that shows it."""
    done = subprocess.run(command, cwd=folder, capture_output=True, text=True, env={**os.environ, **QUIET_ENV}, timeout=300)
    if done.returncode:
        raise RuntimeError(f"{' '.join(command[:3])} failed ({done.returncode}) in {folder}:\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
    return done.stdout + done.stderr


def dvc(folder: Path, *args: str) -> str:
    return run([sys.executable, "-m", "dvc", *args], folder)


class DvcProject:
    """A git repository with DVC, a two-stage pipeline (prepare -> train) and a local remote under ``folder``."""

    def __init__(self, folder: str | Path, subset: int = 1000, hidden: int = 32, epochs: int = 2):
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.remote = self.folder.parent / f"{self.folder.name}-remote"
        run(["git", "init", "-q"], self.folder)
        dvc(self.folder, "init", "-q")
        dvc(self.folder, "config", "core.analytics", "false")
        dvc(self.folder, "remote", "add", "-d", "local", str(self.remote))
        (self.folder / "dvc.yaml").write_text(yaml.safe_dump(PIPELINE, sort_keys=False))
        self.params = {"prepare": {"subset": subset}, "train": {"hidden": hidden, "epochs": epochs}}
        self._write_params()

    def _write_params(self) -> None:
        (self.folder / "params.yaml").write_text(yaml.safe_dump(self.params, sort_keys=False))

    def set_param(self, stage: str, name: str, value) -> None:
        self.params[stage][name] = value
        self._write_params()

    def repro(self) -> list[str]:
        """Run ``dvc repro``; the stages that actually ran, in order."""
        output = dvc(self.folder, "repro")
        return re.findall(r"Running stage '([\w-]+)'", output)

    def commit(self, message: str) -> None:
        run(["git", "add", "-A"], self.folder)
        run(["git", "commit", "-q", "-m", message], self.folder)

    def push(self) -> int:
        """Push the cached outputs to the local remote; how many files the remote holds."""
        dvc(self.folder, "push", "-q")
        return sum(1 for p in self.remote.rglob("*") if p.is_file())


@dataclass
class ReproStep:
    change: str = column("what changed")
    ran: str = column("stages dvc repro ran")
    stages: list[str]  # the stages that ran, as a list (empty: up to date)


class ReproReport(Report):
    """Each change and the stages ``dvc repro`` ran for it: ``find(change=...).stages``."""

    title = "dvc repro runs only what a change invalidates"


def reproduce_step_by_step(folder: str | Path) -> ReproReport:
    """Build the pipeline, then change one thing at a time and record which stages DVC reruns."""
    project = DvcProject(folder)
    steps = []

    def record(change: str) -> None:
        ran = project.repro()
        steps.append(ReproStep(change, ", ".join(ran) or "(none: up to date)", list(ran)))

    record("first run")
    project.commit("pipeline and its lock file")
    record("nothing")
    project.set_param("train", "epochs", 3)
    record("train.epochs 2 -> 3")
    project.set_param("prepare", "subset", 1500)
    record("prepare.subset 1000 -> 1500")
    stored = project.push()
    report = ReproReport(steps, [f"git + DVC repository in {project.folder}; `dvc push` stored {stored} files in the "
                                 f"local remote {project.remote}"])
    report.project = project
    return report
