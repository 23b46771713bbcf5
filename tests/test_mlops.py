"""helpers.mlops tracking and versioning: a real MLflow store and a real git + DVC repository, in temporary folders."""
from __future__ import annotations

import mlflow
import mlflow.pytorch
import pytest
import torch

from helpers.mlops import promote_best, reproduce_step_by_step, tracked_sweep
from helpers.serving import mnist_holdout

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    return tracked_sweep((8, 32), (1e-3,), epochs=2, experiment="test-sweep", folder=tmp_path_factory.mktemp("mlflow"))


def test_every_run_is_stored_with_params_per_epoch_metrics_and_a_model(sweep):
    assert sweep.uri.endswith("mlflow.db") and "sqlite" in sweep.uri
    mlflow.set_tracking_uri(sweep.uri)
    client = mlflow.MlflowClient(sweep.uri)
    for row in sweep.rows:
        run = client.get_run(row.run_uuid)
        assert run.data.params["hidden"] == str(row.hidden) and run.data.tags["torch"]
        history = client.get_metric_history(row.run_uuid, "holdout_accuracy")
        assert sorted(m.step for m in history) == [1, 2]
        assert max(history, key=lambda m: m.step).value == pytest.approx(row.accuracy)
    pixels, labels = mnist_holdout(300)
    model = mlflow.pytorch.load_model(sweep.rows[-1].model_uri)  # the logged artifact, not the object in memory
    with torch.no_grad():
        accuracy = (model(pixels).argmax(1) == labels).float().mean().item()
    assert accuracy == pytest.approx(sweep.rows[-1].accuracy, abs=0.05)


def test_the_champion_alias_points_at_the_best_run_and_reloads_identically(sweep):
    promotion = promote_best(sweep, name="test-digits")
    row = promotion.rows[0]
    assert row.alias == "champion" and row.same_predictions
    client = mlflow.MlflowClient(sweep.uri)
    version = client.get_model_version_by_alias("test-digits", "champion")
    assert client.get_run(version.run_id).info.run_id == max(sweep.rows, key=lambda r: r.accuracy).run_uuid


def test_dvc_reruns_only_what_a_change_invalidates(tmp_path):
    steps = reproduce_step_by_step(tmp_path / "project")
    assert steps.find(change="first run").stages == ["prepare", "train"]
    assert steps.find(change="nothing").stages == []
    assert steps.find(change="train.epochs 2 -> 3").stages == ["train"]
    assert steps.find(change="prepare.subset 1000 -> 1500").stages == ["prepare", "train"]
    assert (tmp_path / "project" / "dvc.lock").exists() and any((tmp_path / "project-remote").rglob("*"))
