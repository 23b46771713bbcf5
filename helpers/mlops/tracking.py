"""MLflow's store and UI for lecture 9, on a local SQLite file under build/ (the logging itself is written in the lecture).

``tracking_store`` names the store, ``quiet_mlflow`` points MLflow at it without its notices, and
``start_mlflow_ui`` serves the UI on a free loopback port (``make mlflow-ui`` in the foreground).
"""
from __future__ import annotations

import logging
import os
from pathlib import Path

from helpers.core.paths import build_dir


def tracking_store(folder: str | Path | None = None) -> tuple[str, str]:
    """(tracking URI of a SQLite store, artifact root) in ``folder`` (default build/mlflow)."""
    folder = Path(folder) if folder else build_dir("mlflow")
    folder.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{folder.resolve() / 'mlflow.db'}", (folder.resolve() / "artifacts").as_uri()


def quiet_mlflow(uri: str):
    """The ``mlflow`` module pointed at ``uri``, quiet (its INFO lines, warnings and telemetry are not the lecture)."""
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    import mlflow
    import mlflow.pytorch  # noqa: F401 - the flavour lecture 9 logs with, loaded with the client

    logging.getLogger("mlflow").setLevel(logging.WARNING)
    logging.getLogger("alembic").setLevel(logging.WARNING)
    logging.getLogger("mlflow.pytorch").setLevel(logging.ERROR)
    mlflow.set_tracking_uri(uri)
    return mlflow


def experiment_id(mlflow, name: str, artifact_root: str) -> str:
    found = mlflow.get_experiment_by_name(name)
    return found.experiment_id if found else mlflow.create_experiment(name, artifact_location=f"{artifact_root}/{name}")


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
