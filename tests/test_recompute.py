"""helpers.distributed.recompute: checkpointing's time cost, predicted from the parts of a step and measured."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from helpers.distributed import demo_transformer, example_batch, recompute_cost
from helpers.distributed.recompute import RecomputeCost, _input_of

from .test_memsave import checkpointed


@pytest.fixture(scope="module")
def model():
    return demo_transformer(layers=2, width=32, seq_len=16, vocab=64)


def cost(**overrides) -> RecomputeCost:
    numbers = dict(predicted=0.30, measured=0.31, noise=0.01, backward_per_forward=2.0, blocks_share=0.9, optimizer_share=0.05,
                   group_cost=0.0, groups=4, blocks_seconds=0.04, description="")
    return RecomputeCost([], **{**numbers, **overrides})


def test_the_blocks_input_is_what_the_blocks_see(model):
    example = example_batch(model, 2)
    x = _input_of(model.blocks[0], model, example)
    for block in model.blocks:
        x = block(x)
    assert torch.allclose(model.head(model.ln(x)), model(example), atol=1e-6)


def test_a_real_measurement_has_every_part_and_an_explanation(model):
    report = recompute_cost(model, checkpointed, batch_size=2, rounds=1)
    assert report.find(part="plain update").share == 1.0
    wrapped = report.find(part="update, checkpoint every 1 block")
    assert wrapped.seconds > 0 and report.groups == 2
    assert report.measured == pytest.approx(wrapped.share - 1)
    assert f"Measured: {report.measured:+.0%}" in report.explanation
    if not report.overrun:  # a part that took longer than its whole leaves no prediction to state
        assert f"add {report.predicted:+.0%}." in report.explanation
    # the blocks are timed inside the forward they belong to, so they can never take longer than it
    assert report.find(part="  of which the checkpointed blocks").seconds <= report.find(part="forward (loss included)").seconds
    assert report.explanation in report.notes  # the numbers of this run, said under its table


def test_groups_follow_every(model):
    assert recompute_cost(model, checkpointed, batch_size=2, every=2, rounds=1).groups == 1


def test_the_explanation_follows_the_numbers():
    assert "within the noise floor" in cost().explanation and "wide floor" not in cost().explanation
    assert "wide floor" in cost(measured=0.45, noise=0.12).explanation
    larger = cost(measured=0.70, group_cost=0.003).explanation
    assert "points more" in larger and "cost of checkpointing itself" in larger
    smaller = cost(measured=0.10).explanation
    assert "points less" in smaller and "cheaper" in smaller
    assert "do not hold together" in cost(measured=0.10, blocks_share=1.3).explanation
    # a part longer than its whole predicts nothing, even where the numbers would happen to agree
    for overran in (cost(blocks_share=1.12), cost(overrun="the whole update took less than its forward + backward")):
        assert "No prediction" in overran.explanation and "add" not in overran.explanation and "within" not in overran.explanation
    assert "do not hold together" in cost(measured=0.95, noise=0.2).explanation


def test_bad_arguments_say_what_to_do(model):
    with pytest.raises(ValueError, match="rounds"):
        recompute_cost(model, checkpointed, rounds=0)
    with pytest.raises(ValueError, match="blocks="):
        recompute_cost(nn.Sequential(nn.Linear(2, 2)), checkpointed, rounds=1)
