"""Experiment tracking and model versioning with MLflow, on a local SQLite store under build/.

Each run of a sweep logs its parameters, a held-out accuracy and the training loss per epoch, the
model as an artifact (with the pinned torch version as its environment), and the machine it ran on.
The best run's model is registered, and the alias ``champion`` moves to it: serving code loads
``models:/<name>@champion`` and never needs to know a version number.
"""
from __future__ import annotations

import logging
import os
import platform
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import torch

from helpers.core.paths import build_dir
from helpers.core.report import Report, column
from helpers.serving import mnist_holdout, train_mnist_model


def tracking_store(folder: str | Path | None = None) -> tuple[str, str]:
    """(tracking URI of a SQLite store, artifact root) in ``folder`` (default build/mlflow)."""
    folder = Path(folder) if folder else build_dir("mlflow")
    folder.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{folder.resolve() / 'mlflow.db'}", (folder.resolve() / "artifacts").as_uri()


def _mlflow(uri: str):
    """MLflow pointed at ``uri``, quiet (its INFO lines and telemetry are not the lecture)."""
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    import mlflow
    import mlflow.pytorch  # noqa: F401 - the flavour used below, loaded with the client

    logging.getLogger("mlflow").setLevel(logging.WARNING)
    logging.getLogger("alembic").setLevel(logging.WARNING)
    mlflow.set_tracking_uri(uri)
    return mlflow


def experiment_id(mlflow, name: str, artifact_root: str) -> str:
    found = mlflow.get_experiment_by_name(name)
    return found.experiment_id if found else mlflow.create_experiment(name, artifact_location=f"{artifact_root}/{name}")


@dataclass
class TrackedRun:
    run_id: str = column("run")
    hidden: int = column("hidden units")
    lr: float = column("learning rate", "g")
    epochs: int = column("epochs")
    accuracy: float = column("held-out accuracy", ".1%")
    final_loss: float = column("last epoch loss", ".3f")
    model_uri: str = ""
    run_uuid: str = ""


class SweepReport(Report):
    """The runs of one tracked sweep, as MLflow stored them; ``best()`` is the most accurate."""

    title = "A tracked sweep (MLflow)"

    def __init__(self, rows, uri: str, experiment: str):
        self.uri, self.experiment = uri, experiment
        super().__init__(rows, [f"store: {uri}; experiment {experiment!r}"])


def tracked_sweep(hidden_sizes: Sequence[int] = (16, 64), lrs: Sequence[float] = (1e-3,), epochs: int = 3,
                  experiment: str = "mnist-sweep", folder: str | Path | None = None) -> SweepReport:
    """Train one served-model MLP per (hidden, lr), each an MLflow run with params, per-epoch metrics and the model."""
    uri, artifacts = tracking_store(folder)
    mlflow = _mlflow(uri)
    eid = experiment_id(mlflow, experiment, artifacts)
    pixels, labels = mnist_holdout()
    rows = []
    for hidden in hidden_sizes:
        for lr in lrs:
            with mlflow.start_run(experiment_id=eid, run_name=f"hidden={hidden} lr={lr:g}") as run:
                mlflow.log_params({"hidden": hidden, "lr": lr, "epochs": epochs, "optimizer": "Adam", "batch_size": 64})
                mlflow.set_tags({"torch": torch.__version__, "python": platform.python_version(), "machine": platform.machine()})
                last = {}

                def log_epoch(epoch, model, loss):
                    with torch.no_grad():
                        accuracy = (model(pixels).argmax(1) == labels).float().mean().item()
                    mlflow.log_metrics({"train_loss": loss, "holdout_accuracy": accuracy}, step=epoch)
                    last.update(loss=loss, accuracy=accuracy)

                model, info = train_mnist_model(epochs=epochs, hidden=hidden, lr=lr, on_epoch=log_epoch)
                logged = mlflow.pytorch.log_model(model, name="model", input_example=pixels[:2].numpy(),
                                                  pip_requirements=[f"torch=={torch.__version__.split('+')[0]}"])
                rows.append(TrackedRun(run.info.run_id[:8], hidden, lr, epochs, last["accuracy"], last["loss"], logged.model_uri,
                                       run.info.run_id))
    return SweepReport(rows, uri, experiment)


@dataclass
class Promotion:
    name: str = column("registered model")
    version: int = column("version")
    alias: str = column("alias")
    run_id: str = column("from run")
    same_predictions: bool = column("reloaded model predicts the same")


class PromotionReport(Report):
    title = "Model registry: the champion"


def promote_best(sweep: SweepReport, name: str = "mnist-digits", alias: str = "champion") -> PromotionReport:
    """Register the sweep's best model as a new version of ``name``, move ``alias`` to it, reload it by alias."""
    mlflow = _mlflow(sweep.uri)
    from mlflow import MlflowClient

    best = max(sweep.rows, key=lambda r: r.accuracy)
    version = mlflow.register_model(best.model_uri, name)
    MlflowClient().set_registered_model_alias(name, alias, version.version)
    reloaded = mlflow.pytorch.load_model(f"models:/{name}@{alias}")
    original = mlflow.pytorch.load_model(best.model_uri)
    pixels, _ = mnist_holdout(200)
    with torch.no_grad():
        same = bool(torch.equal(reloaded(pixels).argmax(1), original(pixels).argmax(1)))
    return PromotionReport([Promotion(name, int(version.version), alias, best.run_id, same)])


def mlflow_ui_command(port: int, folder: str | Path | None = None) -> list[str]:
    """The command that serves MLflow's UI on 127.0.0.1:``port`` over the store in ``folder`` (default build/mlflow)."""
    uri, artifacts = tracking_store(folder)
    return [str(Path(os.sys.executable).with_name("mlflow")), "server", "--backend-store-uri", uri,
            "--default-artifact-root", artifacts, "--host", "127.0.0.1", "--port", str(port), "--workers", "1"]


def start_mlflow_ui(folder: str | Path | None = None, port: int | None = None):
    """MLflow's UI as a child process on a free port (a ServedProcess: ``.url``, ``.stop()``)."""
    from helpers.core.procs import ServedProcess, free_port

    port = port or free_port()
    return ServedProcess(mlflow_ui_command(port, folder), port, health_path="/health",
                         log_path=build_dir("mlflow") / f"ui-{port}.log", env={"MLFLOW_DISABLE_TELEMETRY": "true"},
                         startup_timeout=120)


def main() -> None:
    """``make mlflow-ui``: serve the UI in the foreground until Ctrl-C."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m helpers.mlops.tracking", description="MLflow's UI on the kit's store")
    parser.add_argument("--port", type=int, default=5000)
    args = parser.parse_args()
    command = mlflow_ui_command(args.port)
    print(f"MLflow UI on http://127.0.0.1:{args.port} (store {tracking_store()[0]}); Ctrl-C stops it", flush=True)
    os.execv(command[0], command)


if __name__ == "__main__":
    main()
