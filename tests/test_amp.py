"""helpers.training.amp: bytes per parameter and activations of a training step (via training_memory), fp32 vs AMP."""
from __future__ import annotations

import dataclasses

import pytest
import torch
from torch import nn

from helpers.training import amp


def _mlp(width: int = 64) -> nn.Module:
    """Narrow and deep with a small output: at a large batch its activations dominate, as in most training."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(width, width), nn.GELU(), nn.Linear(width, width), nn.GELU(), nn.Linear(width, 8))


def test_step_memory_counts_sixteen_bytes_per_parameter_with_adam_in_both_modes():
    model, x = _mlp(), torch.randn(256, 64)
    n = sum(p.numel() for p in model.parameters())
    fp32 = amp.step_memory(model, x, "adam")
    mixed = amp.step_memory(model, x, "adam", amp="bf16")
    for run in (fp32, mixed):
        assert run.parameters == n
        assert run.param_bytes == 4 * n and run.grad_bytes == 4 * n
        assert 8 * n <= run.optimizer_bytes < 8 * n + 64  # two moments, plus Adam's scalar step counters
        assert run.bytes_per_parameter == pytest.approx(16, abs=0.1)
        assert run.peak_bytes >= run.param_bytes + run.optimizer_bytes
    assert mixed.activation_bytes < fp32.activation_bytes  # what AMP does save
    assert (fp32.mode, mixed.mode) == ("fp32", "AMP bf16")


def test_step_memory_with_sgd_momentum_is_twelve_bytes_per_parameter():
    run = amp.step_memory(_mlp(), torch.randn(32, 64), "sgd_momentum")
    assert run.bytes_per_parameter == pytest.approx(12, abs=0.1)
    with pytest.raises(ValueError, match="adam"):
        amp.step_memory(_mlp(), torch.randn(32, 64), "lion")


def test_amp_comparison_reports_both_modes_against_figures_worked_by_hand():
    model, x = _mlp(), torch.randn(128, 64)
    report = amp.amp_comparison(model, x, "cpu", min_run_time=0.02)
    assert [r.mode for r in report.rows] == ["fp32", "AMP bf16"]
    assert report.fp32.speedup == 1.0 and report.amp.speedup == pytest.approx(report.fp32.step_seconds / report.amp.step_seconds)

    # worked by hand for fp32 at batch 128: four 128x64 tensors kept for the backward pass (each Linear's and GELU's
    # output), the 128x8 output and the scalar loss, 4 bytes each
    assert report.fp32.memory.activation_bytes == 4 * (4 * 128 * 64 + 128 * 8 + 1)
    assert report.amp.memory.activation_bytes < report.fp32.memory.activation_bytes
    assert "bytes per parameter" in report.table()
    assert len(report.plot().patches) == 8  # four categories x two modes


def test_fp16_path_with_a_grad_scaler_runs_on_the_cpu_too():
    # a GPU's default is fp16 with torch.amp.GradScaler: the same code path, checked without a GPU
    report = amp.amp_comparison(_mlp(32), torch.randn(64, 32), "cpu", amp="fp16", min_run_time=0.02)
    assert report.amp.mode == "AMP fp16"
    assert report.amp.memory.bytes_per_parameter == pytest.approx(16, abs=0.1)


def test_the_speed_sentence_follows_the_measured_speed_up_and_the_devices_support():
    report = amp.amp_comparison(_mlp(), torch.randn(128, 64), "cpu", min_run_time=0.02)
    measured = report.speed_sentence()
    assert f"{report.amp.speedup:.2f}x" in measured or f"{1 / report.amp.speedup:.2f}x" in measured
    for speedup, words in ((2.5, "2.50x as fast"), (1.0, "at fp32's speed"), (0.5, "slower than fp32 (2.00x its time)")):
        report.amp = dataclasses.replace(report.amp, speedup=speedup)
        assert words in report.speed_sentence()
    report.native_low = False
    assert "no native bf16 arithmetic" in report.speed_sentence()  # a slow step on a CPU without bf16 units says why
    assert "avx512_bf16 nor amx_bf16" in report.speed_sentence() and "likely" in report.speed_sentence()  # the flags it read


def test_compute_bound_width_sizes_layers_from_the_gpus_peak(monkeypatch):
    assert amp.compute_bound_width("cpu", 4096) == 256
    monkeypatch.setattr(amp, "pick_device", lambda device: torch.device("cuda"))
    monkeypatch.setattr(amp, "is_gpu", lambda device: True)
    monkeypatch.setattr(amp, "resolve_amp", lambda wanted, device: torch.float16)
    monkeypatch.setattr(amp, "peak_flops", lambda device, dtype: {"fp16": 989.4e12}.get(dtype))  # an H100 SXM's dense fp16
    # sqrt(2e-4 s x 989.4e12 FLOP/s / (2 x 4096)) = 4,915, rounded to 38 tiles of 128
    assert amp.compute_bound_width("cuda", 4096) == 4864
    assert amp.compute_bound_width("cuda", 4096, busy_seconds=1e-9) == 128  # never below one tile
    monkeypatch.setattr(amp, "peak_flops", lambda device, dtype: None)
    assert amp.compute_bound_width("cuda", 4096) == 4096
    with pytest.raises(ValueError, match="batch"):
        amp.compute_bound_width("cuda", 0)
