"""helpers.distributed.offload: OffloadedAdam is Adam; offloading moves the optimizer state off the device and costs two copies per step."""
from __future__ import annotations

import matplotlib
import matplotlib.pyplot as plt
import pytest
import torch
from torch import nn

from helpers.distributed.memsave import demo_transformer
from helpers.distributed.offload import OffloadedAdam, offload_memory

matplotlib.use("Agg")

def test_offloaded_adam_takes_the_same_steps_as_torch_adam():
    torch.manual_seed(0)
    a, b = nn.Linear(8, 4), nn.Linear(8, 4)
    b.load_state_dict(a.state_dict())
    optimizers = [(a, torch.optim.Adam(a.parameters(), lr=1e-2)), (b, OffloadedAdam(b.parameters(), lr=1e-2))]
    for _ in range(3):
        x = torch.randn(5, 8)
        for model, opt in optimizers:
            opt.zero_grad()
            model(x).pow(2).mean().backward()
            opt.step()
    assert torch.allclose(a.weight, b.weight, atol=1e-7) and torch.allclose(a.bias, b.bias, atol=1e-7)
    state = optimizers[1][1].state[b.weight]
    assert state["master"].dtype == torch.float32 and state["exp_avg"].device == torch.device("cpu")


@pytest.mark.slow  # the heaviest of the unit tests: left out of make test-fast
def test_offloading_frees_the_optimizer_state_on_the_device_and_copies_the_parameters_twice():
    model = demo_transformer(layers=2, width=32, seq_len=16, vocab=64)
    params = sum(p.numel() for p in model.parameters())
    report = offload_memory(model, batch_size=2, rounds=1)
    plain, offloaded, half = report.rows
    assert plain.device_optimizer_state == 8 * params and offloaded.device_optimizer_state == half.device_optimizer_state == 0
    assert plain.device_peak - offloaded.device_peak == report.device_saving >= 8 * params
    assert plain.host_bytes == 0 and offloaded.host_bytes >= 12 * params  # master weights and both moments
    assert offloaded.copied_per_step == 2 * 4 * params and half.copied_per_step == 2 * 2 * params
    assert offloaded.transfer_seconds == pytest.approx(offloaded.copied_per_step / (report.bandwidth_gbs * 1e9))
    assert plain.update_seconds > 0 and offloaded.update_seconds > 0 and half.update_seconds is None
    ax = report.plot()
    device_bars, host_bars = ax.patches[:3], ax.patches[3:]  # one group per setup: the device's peak, then host memory
    assert [bar.get_height() for bar in device_bars] == [r.device_peak for r in report.rows]
    assert [bar.get_height() for bar in host_bars] == [r.host_bytes for r in report.rows]
    assert device_bars[1].get_height() < device_bars[0].get_height() and host_bars[0].get_height() == 0  # what offloading moves
    plt.close(ax.figure)
