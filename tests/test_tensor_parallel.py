"""helpers.distributed.tensor_parallel on real gloo workers: split layers equal the unsplit ones, with the collectives Megatron predicts."""
from __future__ import annotations

import sys

import cloudpickle
import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from helpers.core.report import startswith
from helpers.core.workers import launch
from helpers.distributed.tensor_parallel import (
    copy_to_parallel,
    exchange,
    gather_from_parallel,
    reduce_from_parallel,
    scatter_to_parallel,
    tensor_parallel_check,
)

cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the layers below are built in the workers


def _mine(t, dim):
    return nn.Parameter(t.detach().chunk(dist.get_world_size(), dim)[dist.get_rank()].clone())


class Column(nn.Module):
    def __init__(self, full, gather_output=True):
        super().__init__()
        self.weight, self.bias, self.gather_output = _mine(full.weight, 0), _mine(full.bias, 0), gather_output

    def forward(self, x):
        y = F.linear(copy_to_parallel(x), self.weight, self.bias)
        return gather_from_parallel(y, -1) if self.gather_output else y


class Row(nn.Module):
    def __init__(self, full, input_is_parallel=False):
        super().__init__()
        self.weight, self.bias, self.input_is_parallel = _mine(full.weight, 1), nn.Parameter(full.bias.detach().clone()), input_is_parallel

    def forward(self, x):
        x = x if self.input_is_parallel else scatter_to_parallel(x, -1)
        return reduce_from_parallel(F.linear(x, self.weight)) + self.bias


class ColumnWithoutF(Column):
    """Forgets copy_to_parallel: the output is right, the input's gradient misses the other ranks' share."""

    def forward(self, x):
        y = F.linear(x, self.weight, self.bias)
        return gather_from_parallel(y, -1) if self.gather_output else y

pytestmark = pytest.mark.slow


def test_split_layers_match_one_device_with_one_all_reduce_each_way_for_the_mlp():
    report = tensor_parallel_check(Column, Row, world_sizes=(2,), batch=4, width=16, hidden=32)
    assert len(report.rows) == 4
    assert all(r.same_output and r.same_gradients for r in report.rows)
    mlp = report.find(layer=startswith("MLP: column"), world_size=2)
    assert mlp.forward == "1 all_reduce (256 B)" and mlp.backward == "1 all_reduce (256 B)"
    assert mlp.sent_per_rank == 2 * 256 * 2 * (2 - 1) / 2 and mlp.weights_per_rank == pytest.approx(0.5, abs=0.01)
    column = report.find(layer=startswith("column"), world_size=2)
    assert column.forward.startswith("1 all_gather") and column.backward.startswith("1 all_reduce")
    assert report.find(layer=startswith("MLP via torch"), world_size=2).forward == "1 all_reduce"
    with pytest.raises(ValueError, match="multiples"):
        tensor_parallel_check(Column, Row, world_sizes=(3,), width=16, hidden=32)


def test_a_column_layer_without_f_gets_wrong_input_gradients():
    report = tensor_parallel_check(ColumnWithoutF, Row, world_sizes=(2,), batch=4, width=16, hidden=32, with_torch=False)
    column = report.find(layer=startswith("column"), world_size=2)
    assert column.same_output and not column.same_gradients


def _consumers_differ(use_exchange: bool) -> bool:
    """Each rank multiplies the gathered halves by its own weights; is the gradient of its half right?"""
    rank = dist.get_rank()
    torch.manual_seed(0)
    halves = [torch.randn(3, 2) for _ in range(2)]
    weights = [torch.randn(4, 5) for _ in range(2)]
    mine = halves[rank].clone().requires_grad_()
    gathered = (exchange if use_exchange else gather_from_parallel)(mine, 1)
    (gathered @ weights[rank]).sum().backward()
    whole = torch.cat(halves, 1).requires_grad_()
    sum((whole @ w).sum() for w in weights).backward()  # one device: both towers' losses
    return torch.allclose(mine.grad, whole.grad.chunk(2, 1)[rank])


def test_exchange_sums_the_gradients_of_different_consumers_and_a_plain_gather_does_not():
    assert launch(_consumers_differ, 2, args=(True,), echo=False) == [True, True]
    assert launch(_consumers_differ, 2, args=(False,), echo=False) == [False, False]
