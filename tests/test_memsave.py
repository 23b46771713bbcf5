"""helpers.distributed.memsave: checkpointing, gradient accumulation and mixed precision, on training_memory and real steps."""
from __future__ import annotations

import copy

import matplotlib
import matplotlib.pyplot as plt
import pytest
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from helpers import measure_training_memory, training_memory
from helpers.distributed.memsave import (
    accumulation_memory,
    checkpointing_memory,
    demo_transformer,
    example_batch,
    gradients_after,
    keeping_gradients,
    mean_square_loss,
    precision_memory,
)

matplotlib.use("Agg")


class Checkpointed(nn.Module):
    def __init__(self, *blocks):
        super().__init__()
        self.inner = nn.Sequential(*blocks)

    def forward(self, x):
        return checkpoint(self.inner, x, use_reentrant=False)


def checkpointed(model, every):
    """A copy of a demo transformer with its blocks checkpointed in groups of ``every`` (the lecture writes its own)."""
    wrapped = copy.deepcopy(model)
    blocks = list(wrapped.blocks)
    wrapped.blocks = nn.ModuleList(Checkpointed(*blocks[i:i + every]) for i in range(0, len(blocks), every))
    return wrapped


def keeps_everything(model, every):
    """Claims to checkpoint but does not: the comparison must show no saving."""
    return copy.deepcopy(model)

@pytest.fixture(scope="module")
def model():
    return demo_transformer(layers=4, width=32, seq_len=32, vocab=64)


def test_checkpointing_trades_activation_memory_and_the_estimate_matches_a_real_step(model):
    report = checkpointing_memory(model, checkpointed, batch_size=8, every=(1,), rounds=1)
    plain, every = report.find(setup="no checkpointing"), report.find(setup="checkpoint every 1 block")
    assert every.activations < plain.activations / 2 and every.peak < plain.peak
    fake = checkpointing_memory(model, keeps_everything, batch_size=8, every=(1,), measure=False, rounds=0)
    assert fake.rows[1].activations == fake.rows[0].activations  # a wrap that keeps everything saves nothing
    for r in report.rows:
        assert r.measured_peak == pytest.approx(r.peak, rel=0.02)
        assert r.seconds > 0
    assert "recomputed forward" in str(report)
    ax = report.plot()
    stacks: dict[int, float] = {}
    for bar in ax.patches:  # one stack of categories per setup
        middle = round(bar.get_x() + bar.get_width() / 2)
        stacks[middle] = stacks.get(middle, 0) + bar.get_height()
    assert [stacks[i] for i in range(len(report.rows))] == [r.peak for r in report.rows]  # the categories add up to the peak
    marker = next(line for line in ax.lines if line.get_label() == "peak of a real step")
    assert list(marker.get_ydata()) == [r.measured_peak for r in report.rows]
    plt.close(ax.figure)


def test_accumulated_gradients_equal_the_big_batch_and_memory_falls_with_the_micro_batch(model):
    report = accumulation_memory(model, batch_size=8, micro_batch_sizes=(8, 4, 2), rounds=0)
    assert [r.micro_batch for r in report.rows] == [8, 4, 2]
    assert all(r.same_gradients for r in report.rows)
    peaks = [r.peak for r in report.rows]
    assert peaks[0] > peaks[1] > peaks[2]
    params = sum(p.numel() * 4 for p in model.parameters())
    assert all(r.gradients == params for r in report.rows[1:])  # the gradients being accumulated are live at the peak
    assert report.rows[0].seconds is None
    with pytest.raises(ValueError, match="divide"):
        accumulation_memory(model, batch_size=8, micro_batch_sizes=(3,), rounds=0, check=False)


def test_the_one_over_k_scaling_is_right_only_for_a_loss_that_averages_over_the_batch(model):
    x = example_batch(model, 8)
    for k in (2, 4):
        assert all(torch.allclose(a, b, rtol=1e-4, atol=1e-6) for a, b in zip(gradients_after(model, x, k), gradients_after(model, x, 1)))

    def summed(output):
        return output.float().pow(2).sum()

    scaled, whole = gradients_after(model, x, 4, summed), gradients_after(model, x, 1, summed)
    assert all(torch.allclose(4 * a, b, rtol=1e-4, atol=1e-5) for a, b in zip(scaled, whole))


@pytest.mark.slow  # the heaviest of the unit tests: left out of make test-fast
def test_keeping_gradients_estimate_matches_a_real_step(model):
    x = example_batch(model, 4)
    estimate = training_memory(model, x, keeping_gradients("adam"), loss_fn=mean_square_loss)
    measured = measure_training_memory(model, x, keeping_gradients("adam"), loss_fn=mean_square_loss)
    plain = training_memory(model, x, "adam", loss_fn=mean_square_loss)
    assert estimate.peak_bytes == pytest.approx(measured.peak_bytes, rel=0.02)
    assert estimate.peak_bytes > plain.peak_bytes


@pytest.mark.slow  # the heaviest of the unit tests: left out of make test-fast
def test_autocast_shrinks_activations_but_not_the_training_state(model):
    report = precision_memory(model, batch_size=8, measure=False)
    fp32, amp, master, half = report.rows
    state = [(r.parameters, r.gradients, r.optimizer_state) for r in (fp32, amp)]
    assert state[0] == state[1]
    assert amp.activations < fp32.activations
    assert half.parameters * 2 == fp32.parameters
    assert master.optimizer_state == fp32.optimizer_state + fp32.parameters  # Adam's state plus an fp32 master copy
    assert all(r.measured_peak is None for r in report.rows)
