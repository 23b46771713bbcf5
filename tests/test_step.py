"""helpers.core.step: the one AMP resolution and the one training step every helper uses."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from helpers.core.step import amp_name, forward_backward, resolve_amp, training_step


def test_resolve_amp_answers_each_way_of_asking():
    assert resolve_amp(False, "cpu") is None and resolve_amp(None, "cuda") is None
    assert resolve_amp(True, "cpu") == torch.bfloat16 and resolve_amp(True, torch.device("cuda", 0)) == torch.float16
    assert resolve_amp("fp16", "cpu") == torch.float16 and resolve_amp("BF16") == torch.bfloat16
    assert resolve_amp(torch.float16, "cpu") == torch.float16
    assert resolve_amp(resolve_amp(True, "cuda"), "cpu") == torch.float16  # a resolved dtype passes through unchanged
    for wrong in ("fp32", "int8", torch.float32, 16):
        with pytest.raises(ValueError, match="16-bit"):
            resolve_amp(wrong, "cpu")
    assert [amp_name(d) for d in (None, torch.float16, torch.bfloat16)] == ["fp32", "fp16", "bf16"]


def _line(w: float) -> nn.Linear:
    model = nn.Linear(2, 1, bias=False)
    with torch.no_grad():
        model.weight.fill_(w)
    return model


def test_one_step_of_sgd_moves_the_weights_by_the_hand_worked_gradient():
    model = _line(1.0)
    x = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
    # loss = sum(x @ w) -> d loss / d w = column sums of x = (4, 6); SGD at lr 0.5 moves w from (1, 1) to (-1, -2)
    loss = training_step(model, torch.optim.SGD(model.parameters(), lr=0.5), x)
    assert loss.item() == pytest.approx(10.0)  # (1 + 2) + (3 + 4)
    assert model.weight.tolist() == [[-1.0, -2.0]]
    assert model.weight.grad is None  # gradients freed after the update


def test_phases_are_reported_in_order_and_the_loss_can_be_dropped():
    model, seen = _line(1.0), []
    result = training_step(model, torch.optim.SGD(model.parameters(), lr=0.1), torch.ones(4, 2), micro_batches=2,
                           on_phase=seen.append, keep_loss=False)
    assert result is None
    assert seen == ["forward", "backward", "forward", "backward", "optimizer step"]


def test_micro_batches_give_the_gradient_of_the_whole_batchs_mean_loss():
    torch.manual_seed(0)
    x = torch.randn(8, 2)
    whole, split = _line(0.5), _line(0.5)
    mean_square = lambda out: out.pow(2).mean()  # noqa: E731
    forward_backward(whole, x, mean_square)
    forward_backward(split, x, mean_square, micro_batches=4)
    # by hand: d/dw mean((x w)^2) = 2/N * sum_i (x_i . w) x_i
    by_hand = 2 / 8 * ((x @ torch.full((2,), 0.5)).unsqueeze(1) * x).sum(0)
    assert torch.allclose(whole.weight.grad[0], by_hand, atol=1e-6)
    assert torch.allclose(split.weight.grad, whole.weight.grad, atol=1e-6)
    with pytest.raises(ValueError, match="does not split into 3"):
        forward_backward(_line(1.0), x, mean_square, micro_batches=3)


def test_a_grad_scaler_step_equals_the_unscaled_step():
    x = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
    plain, scaled = _line(1.0), _line(1.0)
    training_step(plain, torch.optim.SGD(plain.parameters(), lr=0.5), x)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10)
    training_step(scaled, torch.optim.SGD(scaled.parameters(), lr=0.5), x, scaler=scaler)
    assert scaled.weight.tolist() == plain.weight.tolist() == [[-1.0, -2.0]]


def test_autocast_runs_the_forward_in_the_resolved_type():
    seen = []
    model = _line(1.0)
    training_step(model, torch.optim.SGD(model.parameters(), lr=0.1), torch.ones(2, 2),
                  lambda out: seen.append(out.dtype) or out.float().sum(), amp_dtype=resolve_amp(True, "cpu"))
    assert seen == [torch.bfloat16]


def test_a_loss_that_is_not_a_scalar_is_refused_with_the_reason():
    model = _line(1.0)
    with pytest.raises(ValueError, match="scalar"):
        training_step(model, torch.optim.SGD(model.parameters(), lr=0.1), torch.ones(2, 2), lambda out: out)
