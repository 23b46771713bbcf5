"""helpers.training.precision: formats from torch.finfo, tensor-core alignment, autocast, loss scaling."""
from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from helpers.training import precision


@pytest.fixture(scope="module")
def formats():
    return precision.number_formats()


def test_formats_have_the_ieee_and_brain_float_layouts(formats):
    layout = {r.name: (r.bits, r.exponent_bits, r.mantissa_bits) for r in formats.rows}
    assert layout["fp32"] == (32, 8, 23)
    assert layout["fp16"] == (16, 5, 10)
    assert layout["bf16"] == (16, 8, 7)
    assert layout["tf32"] == (19, 8, 10)
    if "fp8 e4m3" in layout:
        assert layout["fp8 e4m3"] == (8, 4, 3) and layout["fp8 e5m2"] == (8, 5, 2)


@pytest.mark.parametrize("name, dtype", [("fp16", torch.float16), ("bf16", torch.bfloat16), ("fp32", torch.float32)])
def test_smallest_subnormal_is_the_last_value_before_zero(formats, name, dtype):
    fmt = formats.find(name=name)
    assert torch.tensor(fmt.smallest_subnormal, dtype=dtype).item() == fmt.smallest_subnormal
    assert torch.tensor(fmt.smallest_subnormal * 0.49, dtype=dtype).item() == 0.0
    assert torch.tensor(fmt.largest, dtype=dtype).item() == fmt.largest
    assert math.isinf(torch.tensor(fmt.largest, dtype=dtype).mul(2).item())


def test_tf32_has_fp32_range_and_fp16_precision(formats):
    tf32, fp32, fp16 = (formats.find(name=n) for n in ("tf32", "fp32", "fp16"))
    assert tf32.kind == "matmul mode" and fp32.kind == "storage"
    assert tf32.epsilon == fp16.epsilon and tf32.smallest_normal == fp32.smallest_normal
    assert math.floor(math.log2(tf32.largest)) == math.floor(math.log2(fp32.largest)) and tf32.largest < fp32.largest


def test_formats_plot_one_bar_per_format(formats):
    ax = formats.plot()
    assert len(ax.get_yticks()) == len(formats.rows)


def test_pad_to_multiple():
    assert precision.pad_to_multiple(50257, 64) == 50304
    assert precision.pad_to_multiple(64, 64) == 64
    assert precision.pad_to_multiple(1, 8) == 8


def test_alignment_flags_an_odd_vocabulary_and_says_what_to_pad_to():
    model = nn.Sequential(nn.Embedding(50257, 768), nn.Linear(768, 50257), nn.Conv2d(3, 64, 3))
    report = precision.tensor_core_alignment(model, "fp16")
    bad = {(r.layer, r.dimension, r.padded) for r in report.misaligned}
    assert bad == {("0", "num_embeddings (vocab)", 50264), ("1", "out_features (N)", 50264), ("2", "in_channels", 8)}
    strict = precision.tensor_core_alignment(model, "fp16", recent_gpu=True)
    assert {r.padded for r in strict.misaligned if r.size == 50257} == {50304}
    with pytest.raises(ValueError, match="int8"):
        precision.tensor_core_alignment(model, "fp12")


def test_autocast_runs_matmuls_low_and_the_loss_in_fp32():
    layer = nn.Linear(16, 16)
    report = precision.autocast_ops(lambda x, y: nn.functional.cross_entropy(layer(x), y), torch.randn(4, 16), torch.randint(0, 16, (4,)), device="cpu")
    assert report.find(op="addmm").runs_in == "bf16"
    assert report.find(op="_log_softmax").runs_in == "fp32"
    assert "cast" in {r.runs_in for r in report.rows}
    with pytest.raises(ValueError, match="16-bit"):
        precision.autocast_ops(lambda: None, device="cpu", dtype="fp32")


def test_loss_scaling_rescues_underflow_and_overflows_when_too_large():
    report = precision.loss_scaling("cpu", width=128, batch=128)
    none, moderate, huge = report.find(scale=1), report.find(scale=2**16), report.find(scale=2**40)
    assert none.underflow_share > 0.3 and none.verdict == "gradients lost to underflow"
    assert moderate.underflow_share < 0.001 and moderate.nonfinite_share == 0 and moderate.relative_error < 0.05
    assert none.relative_error > 10 * moderate.relative_error
    assert huge.nonfinite_share > 0 and huge.relative_error is None and huge.verdict.startswith("overflow")
    assert report.below_subnormal_share > 0.3  # the reference predicts the underflow the fp16 run shows
    ax = report.plot()
    marks = {line.get_label(): line.get_xdata()[0] for line in ax.lines}
    # fp16's smallest subnormal is 2^-24 and smallest normal 2^-14; at scale 2^8 (the first without overflow) gradients
    # down to 2^-24 / 2^8 = 2^-32 survive
    assert marks == {"fp16 smallest subnormal": -24, "fp16 smallest normal": -14, "smallest gradient kept at scale 2^8": -32}
    assert sum(bar.get_height() for bar in ax.patches) == int((report.reference != 0).sum())  # every nonzero gradient binned


def test_scale_history_groups_steps_into_phases_at_one_scale():
    scales = [2.0**40, 2.0**39, 2.0**38, 2.0**38, 2.0**38, 2.0**39, 2.0**39]
    skipped = [True, True, False, False, False, False, False]
    report = precision.scale_history(scales, skipped, growth_interval=3)
    assert [(p.first_step, p.last_step, p.scale, p.skipped_steps) for p in report.rows] == [
        (0, 0, 2.0**40, 1), (1, 1, 2.0**39, 1), (2, 4, 2.0**38, 0), (5, 6, 2.0**39, 0)]
    assert "2 of 7 steps skipped" in str(report)
    ax = report.plot()
    assert list(ax.get_lines()[0].get_ydata()) == scales
    with pytest.raises(ValueError, match="one scale and one skipped flag per step"):
        precision.scale_history([1.0], [True, False], growth_interval=3)
