"""helpers.hardware.alexnet and helpers.hardware.widgets: AlexNet (2012) against one and two 3 GB GTX 580s, and its live widget."""
from __future__ import annotations

import matplotlib
import pytest
import torch
from torchvision.models import alexnet as torchvision_alexnet

from helpers import alexnet_explorer, profile_layer_alexnet, training_memory
from helpers.core.hardware_specs import GTX_580_3GB
from helpers.core.models import alexnet_2012
from helpers.hardware.alexnet import ASSUMED_CONTEXT_BYTES, paper_sgd

matplotlib.use("Agg")
CARD = 3 * 2**30


@pytest.fixture(scope="module")
def case():
    return profile_layer_alexnet()


def meta_alexnet(**kwargs):
    with torch.device("meta"):
        return alexnet_2012(**kwargs)


def test_single_card_figures_against_the_papers_shapes(case):
    # AlexNet (2012), worked by hand: conv1 96x3x11x11, conv2 256x48x5x5 (two groups), conv3 384x256x3x3,
    # conv4 384x192x3x3 and conv5 256x192x3x3 (two groups), fc6 9216->4096, fc7 4096->4096, fc8 4096->1000
    weights = 96 * 3 * 11 * 11 + 256 * 48 * 5 * 5 + 384 * 256 * 3 * 3 + 384 * 192 * 3 * 3 + 256 * 192 * 3 * 3 + 9216 * 4096 + 4096 * 4096 + 4096 * 1000
    biases = 96 + 256 + 384 + 384 + 256 + 4096 + 4096 + 1000
    assert case.single.param_count == weights + biases == 60_965_224
    batch_input = 128 * 3 * 227 * 227 * 4  # fp32 images
    conv1_output = 128 * 96 * 55 * 55 * 4
    assert case.single.categories["input"] == batch_input
    # at least: weights and momentum (8 bytes a parameter), the batch, and conv1's output kept for the backward pass
    floor = 8 * weights + batch_input + conv1_output
    assert floor < case.single_peak_bytes < 4 * floor
    assert case.batch_size == 128 and case.single_peak_bytes == case.single.peak_bytes
    assert case.card_bytes == CARD and case.card is GTX_580_3GB
    one = case.rows[0]
    assert one.configuration.startswith("one GPU") and one.tensors == case.single_peak_bytes


def test_the_split_gives_each_card_its_own_peak(case):
    per_card = case.per_card_peak_bytes
    assert set(per_card) == {"GPU 0", "GPU 1"}
    for peak in per_card.values():
        # each card holds half the weights but receives copies of the other tower's activations
        assert case.single_peak_bytes / 2 < peak < case.single_peak_bytes
    split = case.split.categories_by_device
    assert split["cpu:0"]["input"] > 0 and split["cpu:1"]["input"] == 0  # the batch is fed to GPU 0
    assert split["cpu:0"]["parameters"] == split["cpu:1"]["parameters"] == case.single.param_bytes // 2
    assert case.split.param_bytes == case.single.param_bytes
    headroom = {r.configuration: r.headroom for r in case.rows}
    assert headroom["two GPUs (split): GPU 0"] > headroom["one GPU, whole network"]


def test_largest_batch_one_card_holds(case):
    n = case.largest_batch_tensors
    peak = training_memory(meta_alexnet(), torch.empty(n, 3, 227, 227, device="meta"), paper_sgd).peak_bytes
    above = training_memory(meta_alexnet(), torch.empty(n + 1, 3, 227, 227, device="meta"), paper_sgd).peak_bytes
    assert peak <= CARD < above
    assert 0 < case.largest_batch_with_overheads < n


def test_non_tensor_overheads_are_separate_and_labelled(case):
    names = [o.name for o in case.overheads["one GPU"]]
    assert names == ["cuda context", "convolution workspace", "allocator fragmentation"]
    for row in case.rows:
        assert row.total == row.tensors + row.overheads and row.headroom == CARD - row.total
    tensors_only = next(r for r in case.rows if "tensors only" in r.configuration)
    assert tensors_only.overheads == 0
    text = str(case)
    assert "upper bound" in text and "assumed" in text and "im2col" in text
    if not torch.cuda.is_available():
        assert case.overheads["one GPU"][0].bytes == ASSUMED_CONTEXT_BYTES and "no GPU" in text


def test_plot_shows_layers_and_cards_against_the_card(case):
    ax = case.plot()
    left, right = ax.figure.axes[:2]
    assert "working set" in left.get_title()
    assert [t.get_text() for t in right.get_xticklabels()] == ["one GPU", "GPU 0", "GPU 1"]
    assert any(line.get_ydata()[0] == CARD for line in right.get_lines())
    assert not [t.get_text() for t in right.texts if "GTX" in t.get_text()], "the card's name is written across the bars"
    assert "GTX 580" in " ".join(t.get_text() for t in right.get_legend().get_texts())
    assert all(t.get_fontsize() >= 10 for legend in (left.get_legend(), right.get_legend()) if legend for t in legend.get_texts())


@pytest.mark.slow  # the heaviest of the unit tests: left out of make test-fast
def test_precision_changes_the_peak():
    fp32 = profile_layer_alexnet(batch_size=32)
    half = profile_layer_alexnet(batch_size=32, precision="fp16")
    assert half.single_peak_bytes < 0.6 * fp32.single_peak_bytes
    with pytest.raises(ValueError, match="precision"):
        profile_layer_alexnet(precision="int8")


@pytest.mark.slow  # the heaviest of the unit tests: left out of make test-fast
def test_the_layer_chart_follows_the_precision():
    from helpers.hardware.widgets import render_png

    fp32, half, amp = (profile_layer_alexnet(batch_size=32, precision=p) for p in ("fp32", "fp16", "amp"))
    conv1 = {name: case.layers.rows[0] for name, case in (("fp32", fp32), ("fp16", half), ("amp", amp))}
    assert conv1["fp16"].outputs * 2 == conv1["fp32"].outputs and conv1["fp16"].weights * 2 == conv1["fp32"].weights
    assert conv1["amp"].outputs * 2 == conv1["fp32"].outputs and conv1["amp"].weights == conv1["fp32"].weights  # fp32 master weights
    assert "fp16" in half.plot().figure.axes[0].get_title()
    assert render_png(fp32) != render_png(half)


@pytest.mark.slow  # the heaviest of the unit tests: left out of make test-fast
def test_one_redraw_estimates_each_batch_size_once(monkeypatch):
    from collections import Counter

    from helpers.hardware import alexnet

    seen = Counter()
    real = alexnet.training_memory

    def counted(model, example, *args, **kwargs):
        seen[(type(model).__name__, example.shape[0], kwargs.get("device") is not None)] += 1
        return real(model, example, *args, **kwargs)
    monkeypatch.setattr(alexnet, "training_memory", counted)
    alexnet._cached_peak.cache_clear()
    profile_layer_alexnet(batch_size=96, precision="amp")
    assert seen and max(seen.values()) == 1, [k for k, n in seen.items() if n > 1]


@pytest.mark.slow  # the heaviest of the unit tests: left out of make test-fast
def test_another_network_gets_one_card_figures_only():
    report = profile_layer_alexnet(torchvision_alexnet(), batch_size=16)
    assert report.split is None and not any("GPU 0" in r.configuration for r in report.rows)
    assert report.single_peak_bytes > 0


@pytest.mark.slow  # the heaviest of the unit tests: left out of make test-fast
def test_widget_redraws_the_report_when_its_controls_move():
    explorer = alexnet_explorer(batch_size=128)
    first = explorer.report
    assert first.batch_size == 128 and explorer.redraws == 1
    explorer.batch.value = 64
    assert explorer.redraws == 2 and explorer.report.batch_size == 64
    assert explorer.report.single_peak_bytes < first.single_peak_bytes
    explorer.precision.value = "amp"
    assert explorer.report.precision == "amp" and explorer.report.batch_size == 64
    assert explorer.report.single_peak_bytes < explorer.compute(64, "fp32").single_peak_bytes


@pytest.mark.slow  # the heaviest of the unit tests: left out of make test-fast
def test_a_redraw_draws_the_same_chart_whatever_came_before():
    """Typing 256 as the first change draws exactly what an explorer opened at 256 draws, even with pyplot's state changed."""
    import matplotlib.pyplot as plt

    explorer = alexnet_explorer(batch_size=128)
    stray = plt.figure(figsize=(3, 2))  # another figure is current, and the defaults changed, as in a busy notebook
    with plt.rc_context({"figure.figsize": (4, 3), "figure.dpi": 72, "savefig.bbox": None, "font.size": 20, "axes.grid": False,
                         "patch.linewidth": 3, "legend.fontsize": 4}):
        explorer.batch.value = 256
    plt.close(stray)
    fresh = alexnet_explorer(batch_size=256)
    assert explorer.png == fresh.png, "the same state must give the same image"
    assert explorer.png[:8] == b"\x89PNG\r\n\x1a\n" and len(explorer.png) > 10_000


@pytest.mark.parametrize("in_use_mib, measured", [(480, True), (7_860, False)])
def test_the_context_is_measured_only_where_no_other_process_shares_the_gpu(monkeypatch, in_use_mib, measured):
    """On the GPU machine the suite's workers shared the card: "total - free - reserved" read 7.68 GiB as the context,
    and no batch fitted the GTX 580 any more. Without NVML's per-process figure, such a reading falls back to the
    assumption and says why; a plausible one is the measurement."""
    from helpers.hardware import alexnet

    monkeypatch.setattr(alexnet, "gpu_available", lambda: True)
    monkeypatch.setattr(alexnet, "_own_gpu_bytes", lambda: None)
    monkeypatch.setattr(torch.cuda, "init", lambda: None)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "a shared GPU")
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device=None: 2**30)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (80 * 2**30 - 2**30 - in_use_mib * 2**20, 80 * 2**30))
    size, basis = alexnet.cuda_context_bytes()
    if measured:
        assert size == in_use_mib * 2**20 and basis.startswith("measured on a shared GPU")
    else:
        assert size == alexnet.ASSUMED_CONTEXT_BYTES and "other processes share this GPU" in basis and "7.68 GiB" in basis


def test_one_card_verdict_says_when_it_rests_on_the_estimates():
    # tensors at 78% of the card, over it only with the (upper-bound, assumed) estimates: never a plain "no"
    from helpers.hardware.alexnet import CardRow, Overhead, _one_card_verdict, _row

    gib = 2**30
    estimates = [Overhead("cuda context", 300 * 2**20, "assumed: PyTorch 2 with CUDA 12"), Overhead("convolution workspace", gib // 2, "upper bound")]
    one = _row("one GPU, whole network", 128, int(2.35 * gib), estimates, 3 * gib)
    assert one.fits == "not with estimates"
    verdict = _one_card_verdict(one, estimates)
    assert "only the non-tensor estimates" in verdict and "Krizhevsky" in verdict and "(fits)" in verdict
    assert _row("x", 1, 4 * gib, [], 3 * gib).fits == "no"
    assert _row("x", 1, 1 * gib, estimates, 3 * gib).fits == "yes"
    assert "whatever the estimates" in _one_card_verdict(CardRow("x", 1, 4 * gib, 0, 4 * gib, 3 * gib, -gib, "no"), [])
