"""helpers.mlops: git and DVC by absolute path, the DVC pipeline stage, the MLflow store and alias routing."""
from __future__ import annotations

import json

import pytest
import torch
import yaml
from prometheus_client import CollectorRegistry

from helpers.mlops import AliasRouter, Shell, experiment_id, quiet_mlflow, tool_path, tracking_store

pytestmark = pytest.mark.slow


def test_dvc_runs_from_the_kits_environment_whatever_the_folder_holds(tmp_path):
    (tmp_path / "dvc").mkdir()
    (tmp_path / "dvc" / "__init__.py").write_text("")
    (tmp_path / "dvc" / "__main__.py").write_text("print('a fake dvc')")
    import dvc

    assert tool_path("dvc").startswith("/") and tool_path("git").startswith("/")
    assert Shell(tmp_path)("dvc", "--version").strip() == dvc.__version__


def test_shell_errors_name_the_command_and_show_its_output(tmp_path):
    with pytest.raises(RuntimeError, match="(?s)git rev-parse HEAD failed.*not a git repository"):
        Shell(tmp_path)("git", "rev-parse", "HEAD")


def test_dvc_repro_reruns_the_stage_for_its_data_and_parameters_only(tmp_path):
    sh = Shell(tmp_path)
    sh("git", "init", "-q")
    sh("dvc", "init", "-q")
    (tmp_path / "data").mkdir()
    pixels = torch.rand(200, 784)
    torch.save({"pixels": pixels, "labels": torch.randint(0, 10, (200,))}, tmp_path / "data" / "digits.pt")
    sh("dvc", "add", "data/digits.pt")
    import sys

    stage = {"cmd": f"{sys.executable} -m helpers.mlops.pipeline_stages train", "deps": ["data/digits.pt"],
             "params": ["train.hidden", "train.epochs"], "outs": ["model.pt"], "metrics": [{"metrics.json": {"cache": False}}]}
    (tmp_path / "dvc.yaml").write_text(yaml.safe_dump({"stages": {"train": stage}}))
    (tmp_path / "params.yaml").write_text(yaml.safe_dump({"train": {"hidden": 8, "epochs": 1}, "other": {"x": 1}}))
    assert "Running stage 'train'" in sh("dvc", "repro")
    assert 0 <= json.loads((tmp_path / "metrics.json").read_text())["val_accuracy"] <= 1
    assert "Running stage" not in sh("dvc", "repro")
    (tmp_path / "params.yaml").write_text(yaml.safe_dump({"train": {"hidden": 8, "epochs": 1}, "other": {"x": 2}}))
    assert "Running stage" not in sh("dvc", "repro"), "a parameter the stage does not name must not rerun it"
    (tmp_path / "params.yaml").write_text(yaml.safe_dump({"train": {"hidden": 8, "epochs": 2}, "other": {"x": 2}}))
    assert "Running stage 'train'" in sh("dvc", "repro")


def test_the_router_serves_the_aliases_and_follows_a_moved_alias_without_a_restart(tmp_path):
    uri, artifacts = tracking_store(tmp_path)
    mlflow = quiet_mlflow(uri)
    client = mlflow.MlflowClient()
    experiment = experiment_id(mlflow, "router-test", artifacts)  # artifacts in tmp_path, not the working folder
    versions = []
    for bias in (0.0, 1.0):  # two models that answer differently: class 0 always, then class 1 always
        model = torch.nn.Linear(784, 10)
        with torch.no_grad():
            model.weight.zero_()
            model.bias.zero_()
            model.bias[int(bias)] = 1.0
        with mlflow.start_run(experiment_id=experiment):
            logged = mlflow.pytorch.log_model(model, name="model", serialization_format="pickle", pip_requirements=["torch"])
        versions.append(mlflow.register_model(logged.model_uri, "router-test").version)
    client.set_registered_model_alias("router-test", "champion", versions[0])
    registry = CollectorRegistry()
    router = AliasRouter(uri, "router-test", registry, share=0.5, refresh=3600)
    inputs = torch.rand(1, 784)
    assert {router(inputs).argmax(1).item() for _ in range(20)} == {0}, "only the champion answers without a challenger"
    client.set_registered_model_alias("router-test", "challenger", versions[1])
    router.reload()
    answers = [router(inputs).argmax(1).item() for _ in range(200)]
    assert 60 <= answers.count(1) <= 140, f"the challenger should get about half the calls, got {answers.count(1)} of 200"
    assert registry.get_sample_value("model_predictions_total", {"variant": "challenger", "version": str(versions[1])}) == answers.count(1)
    client.set_registered_model_alias("router-test", "champion", versions[1])
    client.delete_registered_model_alias("router-test", "challenger")
    router.reload()
    assert {router(inputs).argmax(1).item() for _ in range(20)} == {1}, "the promoted version answers every call"
