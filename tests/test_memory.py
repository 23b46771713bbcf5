"""helpers.core.memory: training_memory against real measured steps, meta models, bytes per parameter, working sets, OOM."""
from __future__ import annotations

import dataclasses

import matplotlib
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from helpers import bytes_per_param, fit_batch, measure_training_memory, profile_layer_mem, profile_mem, training_memory
from helpers.core import bytes_kept
from helpers.core.memory import CATEGORIES, PHASES, _AllocatorPeak, _blas_workspaces, default_loss
from helpers.core.models import BasicFCModel, LeNet, alexnet_2012, count_parameters, transformer_lm
from helpers.core.report import format_bytes
from helpers.hardware.oom import largest_batch, parse_bytes

matplotlib.use("Agg")


class SmallResNet(nn.Module):
    """A CNN with batch-norm, in-place ReLUs and residual additions (what ResNets are made of), kept small."""

    def __init__(self, width: int = 16):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, width, 3, padding=1, bias=False), nn.BatchNorm2d(width), nn.ReLU(inplace=True))
        self.block = nn.Sequential(nn.Conv2d(width, width, 3, padding=1, bias=False), nn.BatchNorm2d(width), nn.ReLU(inplace=True),
                                   nn.Conv2d(width, width, 3, padding=1, bias=False), nn.BatchNorm2d(width))
        self.head = nn.Linear(width, 10)

    def forward(self, x):
        x = self.stem(x)
        x = F.relu(x + self.block(x))
        return self.head(F.adaptive_avg_pool2d(x, 1).flatten(1))


def adam_foreach(params):
    return torch.optim.Adam(params, foreach=True)  # the multi-tensor kernels GPUs use by default, here on the CPU


# (architecture, optimizer, amp): five architectures, SGD (plain, momentum), Adam (per tensor, foreach), and AMP.
CASES = {
    "lenet-sgd": (LeNet, lambda m: torch.randn(32, 1, 28, 28), "sgd", False),
    "lenet-adam-amp": (LeNet, lambda m: torch.randn(32, 1, 28, 28), "adam", "bf16"),
    "mlp-adam": (lambda: BasicFCModel(256), lambda m: torch.randn(64, 1, 28, 28), "adam", False),
    "resnet-momentum": (SmallResNet, lambda m: torch.randn(4, 3, 32, 32), "sgd_momentum", False),
    "transformer-adam": (transformer_lm, lambda m: m.example_input(4, 32), "adam", False),
    "transformer-adam-foreach-amp": (transformer_lm, lambda m: m.example_input(4, 32), adam_foreach, "bf16"),
    "alexnet2012-split-momentum": (lambda: alexnet_2012(split=True, num_classes=10), lambda m: torch.randn(1, 3, 227, 227), "sgd_momentum", False),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_estimate_is_within_two_percent_of_a_real_step(case):
    build, make_input, optimizer, amp = CASES[case]
    torch.manual_seed(0)
    model = build()
    x = make_input(model)
    estimate = training_memory(model, x, optimizer, amp=amp)
    measured = measure_training_memory(model, x, optimizer, amp=amp)
    assert abs(estimate.peak_bytes - measured.peak_bytes) <= 0.02 * measured.peak_bytes
    assert estimate.state_bytes == measured.state_bytes and estimate.grad_bytes == measured.grad_bytes
    assert sum(estimate.categories.values()) == estimate.peak_bytes


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_estimate_agrees_with_the_cpu_allocator_itself(optimizer):
    # torch.profiler's memory events see every allocation, independently of MemTracker's tensor bookkeeping.
    model, x = BasicFCModel(512), torch.randn(64, 1, 28, 28)
    measured = measure_training_memory(model, x, optimizer)
    assert measured.allocator == "torch.profiler CPU memory events"
    assert abs(training_memory(model, x, optimizer).peak_bytes - measured.allocator_peak_bytes) <= 0.02 * measured.allocator_peak_bytes


def test_convolutions_use_workspace_that_no_tensor_accounts_for():
    measured = measure_training_memory(LeNet(), torch.randn(64, 1, 28, 28))
    assert measured.workspace_bytes > 0
    assert "workspaces" in str(measured)


def test_meta_models_and_inputs_give_the_same_estimate_as_real_ones():
    torch.manual_seed(0)
    real = transformer_lm()
    with torch.device("meta"):
        meta = transformer_lm()
    tokens = real.example_input(4, 32)
    for amp in (False, "bf16"):
        expected = training_memory(real, tokens, "adam", amp=amp)
        got = training_memory(meta, tokens.to("meta"), "adam", amp=amp)
        assert got.peak_bytes == expected.peak_bytes and got.categories == expected.categories


def test_the_optimizer_state_exists_throughout_the_measured_step():
    model, x = LeNet(), torch.randn(16, 1, 28, 28)
    params = sum(p.numel() for p in model.parameters()) * 4
    sgd, momentum, adam = (training_memory(model, x, o) for o in ("sgd", "sgd_momentum", "adam"))
    assert sgd.state_bytes == 0 and momentum.state_bytes == params and adam.state_bytes >= 2 * params
    assert momentum.categories["optimizer state"] == params  # already there during backward, where the peak is
    assert sgd.peak_bytes < momentum.peak_bytes < adam.peak_bytes


def test_timeline_runs_forward_backward_optimizer_and_peaks_where_reported():
    report = training_memory(LeNet(), (32, 1, 28, 28), "adam")
    phases = [phase for phase, _ in report.timeline]
    assert [p for i, p in enumerate(phases) if i == 0 or phases[i - 1] != p] == list(PHASES)
    totals = [sum(snap["cpu"].values()) for _, snap in report.timeline]
    assert max(totals) == report.peak_bytes
    assert report.timeline[totals.index(max(totals))][0] == report.peak_phase
    ax = report.plot()
    assert ax.get_title().startswith("LeNet") and len(ax.collections) >= 3


def test_report_shows_categories_modules_and_numbers():
    report = training_memory(LeNet(), (8, 1, 28, 28), "sgd_momentum")
    text = str(report)
    for category in CATEGORIES:
        assert category in text
    assert report.param_count == count_parameters(LeNet())
    assert [r.module for r in report.modules.rows][:3] == ["(whole model)", "conv1", "relu1"]
    assert report.modules.rows[0].parameters == report.param_bytes
    assert "<table>" in report._repr_html_()


def test_the_model_is_left_unchanged():
    model = LeNet()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    training_memory(model, (4, 1, 28, 28), "adam")
    measure_training_memory(model, (4, 1, 28, 28), "adam")
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert all(p.grad is None for p in model.parameters())


def test_custom_loss_function():
    def cross_entropy(logits):
        return F.cross_entropy(logits, torch.zeros(logits.shape[0], dtype=torch.long, device=logits.device))

    model, x = BasicFCModel(64), torch.randn(16, 1, 28, 28)
    estimate = training_memory(model, x, "sgd", loss_fn=cross_entropy)
    assert estimate.peak_bytes == measure_training_memory(model, x, "sgd", loss_fn=cross_entropy).peak_bytes


def test_default_loss_is_the_fp32_sum_of_the_output():
    out = torch.tensor([[1.0, 2.0], [3.0, 4.0]], dtype=torch.bfloat16)
    loss = default_loss((out, {"aux": torch.ones(3)}))
    assert loss.dtype == torch.float32 and loss.item() == 13.0
    with pytest.raises(ValueError, match="loss_fn"):
        default_loss(torch.tensor([1, 2]))


def test_bad_arguments_say_what_to_do():
    with pytest.raises(ValueError, match="sgd_momentum"):
        training_memory(LeNet(), (2, 1, 28, 28), "rmsprop")
    with pytest.raises(ValueError, match="amp"):
        training_memory(LeNet(), (2, 1, 28, 28), amp="fp8")
    with pytest.raises(TypeError, match="example input"):
        training_memory(LeNet(), [1.5, 2.5])
    with pytest.raises(ValueError, match="scalar"):
        training_memory(LeNet(), (2, 1, 28, 28), loss_fn=lambda out: out)
    with torch.device("meta"):
        meta = LeNet()
    with pytest.raises(ValueError, match="meta"):
        measure_training_memory(meta, (2, 1, 28, 28))
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="visible GPU"):
            training_memory(meta, (2, 1, 28, 28), device="cuda")


def test_models_that_need_tensor_values_get_a_clear_error():
    class DataDependent(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(4, 4)

        def forward(self, x):
            return self.fc(x) if x.sum().item() > 0 else -self.fc(x)

    with pytest.raises(ValueError, match="values of its tensors.*measure_training_memory"):
        training_memory(DataDependent(), (2, 4))
    assert measure_training_memory(DataDependent(), (2, 4)).peak_bytes > 0


def test_known_gap_for_recurrent_layers_is_stated():
    model = nn.Sequential(nn.LSTM(8, 16, batch_first=True))
    assert "oneDNN" in str(training_memory(model, (2, 5, 8), loss_fn=lambda out: out[0].sum()))


def test_bytes_per_param_theory_matches_training_memory():
    report = bytes_per_param()
    assert [r.theory for r in report.rows] == [8, 12, 16, 16, 16]
    for row in report.rows:
        assert row.measured == pytest.approx(row.theory, abs=0.01)
    master = report.find(setup="mixed precision, Adam, fp32 master copy")
    assert (master.weights, master.master_weights, master.gradients, master.optimizer_state) == (2, 4, 2, 8)
    assert "activations" in str(report)


def test_working_set_per_layer_of_lenet():
    inference = profile_layer_mem(LeNet())
    conv1 = inference.rows[0]
    assert (conv1.layer, conv1.inputs, conv1.weights, conv1.outputs) == ("conv1", 28 * 28 * 4, (150 + 6) * 4, 6 * 24 * 24 * 4)
    assert inference.largest.layer == "fc1"
    training = profile_layer_mem(LeNet(), (8, 1, 28, 28), mode="training")
    fc1 = next(r for r in training.rows if r.layer == "fc1")
    assert fc1.weight_gradients == fc1.weights and fc1.output_gradients == fc1.outputs == 8 * 120 * 4
    ax = training.plot()
    assert len(ax.patches) == 5 * len(training.rows)
    with pytest.raises(ValueError, match="inference"):
        profile_layer_mem(LeNet(), mode="serving")


def test_an_in_place_layer_writes_no_output_of_its_own():
    rows = {r.layer: r for r in profile_layer_mem(SmallResNet(), (2, 3, 8, 8)).rows}
    assert rows["stem.2"].type == "ReLU" and rows["stem.2"].outputs == 0 and rows["stem.2"].inputs == 2 * 16 * 8 * 8 * 4
    assert rows["stem.1"].outputs == rows["stem.1"].inputs  # batch-norm writes a new tensor


def test_memory_shares():
    inference = profile_mem(LeNet())
    assert set(inference.shares) == {"input", "parameters", "activations"}
    assert inference.shares["parameters"] == count_parameters(LeNet()) * 4
    training = profile_mem(LeNet(), (64, 1, 28, 28), mode="training")
    assert training.shares["gradients"] == training.shares["parameters"]
    assert training.shares["activations"] > training.shares["parameters"]  # a batch of 64 outweighs LeNet's weights
    assert sum(r.share for r in training.rows) == pytest.approx(100)
    ax = training.plot()
    wedges = {w.get_label(): w.theta2 - w.theta1 for w in ax.patches}
    assert list(wedges) == ["input", "parameters", "activations", "gradients"]
    assert max(wedges, key=wedges.get) == "activations"  # the chart shows what the shares say
    assert [t.get_text() for t in ax.texts if t.get_text().endswith("%")] == [f"{r.share:.1f}%" for r in training.rows]


def test_largest_batch_is_a_search_that_lands_exactly():
    calls = []

    def linear(batch):
        calls.append(batch)
        return 1_000 + 37 * batch

    best, peaks = largest_batch(linear, 100_000)
    assert best == (100_000 - 1_000) // 37 and len(calls) <= 6
    assert largest_batch(linear, 500) == (0, {1: 1_037})
    assert largest_batch(lambda b: 10 * b * b, 10**6)[0] == 316


def test_a_batch_that_does_not_fit_is_explained_not_run():
    ran = []
    fit = fit_batch(LeNet(), (6000, 1, 28, 28), budget="64 MiB", step=lambda: ran.append(True))
    assert not fit.fits and not ran and not fit.ran
    best = fit.largest_batch
    assert training_memory(LeNet(), (best, 1, 28, 28)).peak_bytes <= 64 * 2**20 < training_memory(LeNet(), (best + 1, 1, 28, 28)).peak_bytes
    assert f"{best:,}" in fit.explanation() and "does not fit" in str(fit)
    ax = fit.plot()
    assert [t.get_text() for t in ax.texts] == ["budget 64.00 MiB"]
    curve = next(line for line in ax.lines if line.get_label() == "one training step")
    under = [(x <= best, y <= 64 * 2**20) for x, y in zip(curve.get_xdata(), curve.get_ydata())]
    assert under and all(small == fits for small, fits in under)  # the curve crosses the budget line at the largest batch
    assert f"largest that fits: {best:,}" in [t.get_text() for t in ax.get_legend().get_texts()]


def test_when_nothing_fits_the_explanation_names_what_does_not_shrink_with_the_batch():
    model = LeNet()
    fit = fit_batch(model, (6000, 1, 28, 28), budget="100 KiB", optimizer="adam")
    persistent = fit.estimate.param_bytes + fit.estimate.grad_bytes + fit.estimate.state_bytes
    assert fit.largest_batch == 0 and persistent > 100 * 2**10
    assert f"{format_bytes(persistent)} of parameters, gradients and optimizer state" in fit.explanation()
    # on a GPU the estimate also holds the cuBLAS workspaces, which are no training state: the explanation names them apart
    workspaces = _blas_workspaces("cuda:0")
    cpu = fit.estimate
    gpu = dataclasses.replace(cpu, peak_by_device={"cuda:0": cpu.peak_bytes + workspaces.total},
                              categories_by_device={"cuda:0": {**cpu.categories, workspaces.label(): workspaces.total}},
                              peak_phase_by_device={"cuda:0": cpu.peak_phase})
    fit.estimate = gpu
    assert f"{format_bytes(workspaces.total)} of {workspaces.label()}" in fit.explanation()


def test_a_real_out_of_memory_error_is_caught_and_explained():
    def greedy_step():
        return torch.empty(2**62, dtype=torch.uint8)  # more than any machine has: the allocator refuses

    fit = fit_batch(LeNet(), (8, 1, 28, 28), budget="1 GiB", step=greedy_step)
    assert fit.fits and not fit.ran and "allocate" in fit.error
    assert "ran out of memory" in fit.explanation()
    ok = fit_batch(LeNet(), (8, 1, 28, 28), budget="1 GiB", step=lambda: 42)
    assert ok.ran and ok.result == 42


def test_parse_bytes():
    assert parse_bytes("512 MiB") == 512 * 2**20 and parse_bytes("3GB") == 3 * 10**9 and parse_bytes(1024) == 1024
    with pytest.raises(ValueError, match="512 MiB"):
        parse_bytes("lots")


def test_without_a_gpu_the_measurement_reads_the_cpu_allocator():
    measured = measure_training_memory(LeNet(), (4, 1, 28, 28))
    assert measured.allocator_peak_bytes >= measured.peak_bytes
    assert "cpu" in measured.source


def test_the_gpu_allocator_peak_keeps_the_blas_workspaces_the_estimate_counts(monkeypatch):
    """The CUDA branch of the allocator measurement, with the allocator's counters played by a dict (no GPU here)."""
    counters = {"now": 0, "max": 0}
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device=None: counters["now"])
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device=None: counters["max"])
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda device=None: counters.update(max=counters["now"]))
    workspaces, baseline, other_model, activations = _blas_workspaces("cuda:0").total, 10 * 2**20, 5 * 2**20, 3 * 2**20
    counters["now"] = baseline + workspaces + other_model  # after the warm-up step: its tensors, its workspaces, something else
    with _AllocatorPeak(torch.device("cuda:0"), baseline) as allocator:
        counters["max"] = counters["now"] + activations
    assert allocator.peak == baseline + workspaces + activations  # the other model left out, the workspaces kept


@pytest.mark.gpu  # compares against torch.cuda.max_memory_allocated, which needs a GPU
@pytest.mark.parametrize("amp", [False, True])
def test_estimate_is_within_two_percent_of_max_memory_allocated_on_a_gpu(amp):
    model = transformer_lm("small").cuda()
    tokens = model.example_input(8, 128)
    estimate = training_memory(model, tokens, "adam", amp=amp)
    measured = measure_training_memory(model, tokens, "adam", amp=amp)
    assert measured.allocator == "torch.cuda.max_memory_allocated"
    assert abs(estimate.peak_bytes - measured.allocator_peak_bytes) <= 0.02 * measured.allocator_peak_bytes


def test_bytes_kept_counts_what_outlives_the_call_once_per_storage():
    kept, weights = [], nn.Parameter(torch.zeros(10))

    def step():
        scratch = torch.ones(1000)  # freed on return: not counted
        state = torch.zeros(100)
        kept.extend([state[:10], state[50:], weights * 2])  # two views of one 400-byte storage, one 40-byte tensor
        weights.grad = scratch[:10].clone()
        return scratch.sum()  # 4 bytes, alive while the caller holds it

    total, result = bytes_kept(step, besides=[weights])
    assert result.item() == 1000
    assert total == 400 + 40 + 40 + 4  # the new gradient counts too: it did not exist when `besides` was given
    total, _ = bytes_kept(lambda: kept.append(weights.grad.mul_(2)), besides=[weights.grad])
    assert total == 0  # an in-place result is the gradient's own storage


def test_bytes_kept_waits_for_a_background_thread_to_let_go():
    import threading
    import time

    def step():
        buffer = torch.zeros(1000)  # a worker thread holds it a moment longer, as gloo's do with a collective's buffers
        threading.Thread(target=lambda held: time.sleep(0.05), args=(buffer,)).start()

    total, _ = bytes_kept(step)
    assert total == 0
