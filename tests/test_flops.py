"""helpers.hardware.flops: the lecture's op-count table, FLOPs equal to FlopCounterMode's, MACs, and the classic rules."""
from __future__ import annotations

import matplotlib
import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from helpers import profile_ops
from helpers.core.models import BasicFCModel, LeNet, alexnet_2012, transformer_lm
from helpers.hardware.flops import flop_counter

matplotlib.use("Agg")

# The lecture's table for its LeNet at (1, 1, 28, 28), row by row.
LECTURE_TABLE = [
    ("conv1", 89_856), ("relu1", 6_912), ("pool1", 2_592), ("conv2", 154_624), ("relu2", 2_048), ("pool2", 768),
    ("fc1", 30_720), ("relu3", 240), ("fc2", 7_200), ("relu4", 120), ("fc3", 600), ("relu5", 20),
]


def test_lenet_reproduces_the_lecture_table_row_by_row():
    report = profile_ops(LeNet(), (1, 1, 28, 28))
    assert [(r.layer, r.ops) for r in report.rows] == LECTURE_TABLE
    assert report.total == 295_700
    assert [r.type for r in report.rows][:3] == ["Conv2d", "ReLU", "MaxPool2d"]
    text = str(report)
    assert "295,700" in text and "89,856" in text and "(1, 1, 28, 28)" in text


def test_default_shape_is_one_sample_of_the_models_input_shape():
    assert profile_ops(LeNet()).total == 295_700


class FunctionalNet(nn.Module):
    """Weights held as parameters but applied with torch.nn.functional and matmul inside forward."""

    def __init__(self):
        super().__init__()
        self.kernel = nn.Parameter(torch.randn(8, 3, 3, 3))
        self.proj = nn.Parameter(torch.randn(8 * 6 * 6, 16))
        self.head = nn.Linear(16, 4)

    def forward(self, x):
        x = F.relu(F.conv2d(x, self.kernel, padding=1))
        x = F.max_pool2d(x, 2)
        x = torch.matmul(torch.flatten(x, 1), self.proj)
        return self.head(x + x)


def small_resnet() -> nn.Module:
    from torchvision.models import resnet18

    return resnet18(num_classes=10)


ARCHITECTURES = {
    "lenet": (LeNet, lambda m: torch.randn(2, 1, 28, 28)),
    "mlp": (lambda: BasicFCModel(64), lambda m: torch.randn(3, 1, 28, 28)),
    "alexnet2012": (lambda: alexnet_2012(num_classes=10), lambda m: torch.randn(1, 3, 227, 227)),
    "resnet18": (small_resnet, lambda m: torch.randn(1, 3, 64, 64)),
    "transformer": (transformer_lm, lambda m: m.example_input(2, 16)),
    "functional": (FunctionalNet, lambda m: torch.randn(2, 3, 12, 12)),
}


@pytest.mark.parametrize("name", sorted(ARCHITECTURES))
def test_flops_equal_flop_counter_mode_on_the_real_model(name):
    build, make_input = ARCHITECTURES[name]
    torch.manual_seed(0)
    model = build().eval()
    x = make_input(model)
    with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter, torch.no_grad():
        model(x)  # attention as two plain matrix products, which FlopCounterMode counts without help
    expected = counter.get_total_flops()
    report = profile_ops(model, x, convention="flops")
    assert expected > 0 and report.total == expected
    assert sum(r.ops for r in report.rows) == report.total
    assert profile_ops(model, x, convention="macs").total == expected // 2


def test_functional_calls_are_charged_to_the_module_that_makes_them():
    report = profile_ops(FunctionalNet(), (2, 3, 12, 12), convention="flops")
    own = {r.type: r.ops for r in report.rows if r.layer == "(model)"}
    assert own["convolution (functional)"] == 2 * 2 * (8 * 12 * 12) * (3 * 3 * 3)
    assert own["mm (functional)"] == 2 * 2 * (8 * 6 * 6) * 16
    classic = {(r.layer, r.type): r.ops for r in profile_ops(FunctionalNet(), (2, 3, 12, 12)).rows}
    assert classic[("(model)", "add (functional)")] == 2 * 16  # one per output element
    assert classic[("head", "Linear")] == 16 * 2 * 4  # in_features x outputs; the bias is not counted


def test_classic_rules_for_batch_norm_average_pool_and_convolution_without_bias():
    model = nn.Sequential(nn.Conv2d(3, 4, 3, bias=False), nn.BatchNorm2d(4), nn.AvgPool2d(2))
    rows = {r.type: r.ops for r in profile_ops(model, (1, 3, 8, 8)).rows}
    assert rows == {"Conv2d": 4 * 6 * 6 * 27, "BatchNorm2d": 2 * 4 * 6 * 6, "AvgPool2d": 4 * 3 * 3 * 4}


def test_uncounted_operators_are_listed_not_hidden():
    report = profile_ops(alexnet_2012(), (1, 3, 227, 227))
    assert "Not counted by the classic convention" in str(report) and "pow" in str(report)
    assert report.totals["classic"] == report.total and report.totals["flops"] > report.total


def test_meta_models_are_counted_without_memory_and_the_model_is_left_alone():
    with torch.device("meta"):
        meta = LeNet()
    assert [(r.layer, r.ops) for r in profile_ops(meta, (1, 1, 28, 28)).rows] == LECTURE_TABLE
    real = LeNet()
    before = real.conv1.weight
    profile_ops(real)
    assert real.conv1.weight is before and not real.conv1._forward_hooks and not real.conv1._forward_pre_hooks


def test_pie_chart_of_ops_by_layer_type():
    report = profile_ops(LeNet())
    assert report.by_type()["Conv2d"] == 89_856 + 154_624
    ax = report.plot()
    labels = [t.get_text() for t in ax.texts]
    assert "Conv2d" in labels and any(label.startswith("other") for label in labels)
    assert "<table>" in report._repr_html_()


def test_bad_arguments_say_what_to_do():
    with pytest.raises(ValueError, match="convention"):
        profile_ops(LeNet(), convention="gflops")
    with pytest.raises(ValueError, match="shape"):
        profile_ops(nn.Linear(4, 2))
    with pytest.raises(TypeError, match="example input"):
        profile_ops(LeNet(), "a picture")


def _flop_counter_total(model: nn.Module, *inputs) -> int:
    """FlopCounterMode on real tensors, in train mode, attention run as two plain matrix products (math backend)."""
    model.train()
    with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter:
        model(*inputs)
    return counter.get_total_flops()


@pytest.mark.parametrize("batch_first", [True, False])
def test_attention_models_count_what_flop_counter_mode_counts(batch_first):
    """Eval mode under no_grad takes the fused attention fast path, which has no FLOP formula: counts must not vanish."""
    torch.manual_seed(0)
    encoder = nn.TransformerEncoder(nn.TransformerEncoderLayer(128, 4, batch_first=batch_first), 2)
    x = torch.randn(3, 50, 128)
    report = profile_ops(encoder, x, convention="flops")
    assert report.total == _flop_counter_total(encoder, x)
    assert profile_ops(encoder, x, convention="macs").total == report.total // 2


def test_a_whole_nn_transformer_counts_what_flop_counter_mode_counts():
    model = nn.Transformer(64, 4, 2, 2, 128, batch_first=True)
    src, tgt = torch.randn(2, 10, 64), torch.randn(2, 7, 64)
    assert profile_ops(model, (src, tgt), convention="flops").total == _flop_counter_total(model, src, tgt)


class BareAttention(nn.Module):
    """Scaled-dot-product attention and nothing else: its FLOPs are the two products only."""

    def forward(self, q, k, v):
        return F.scaled_dot_product_attention(q, k, v)


def test_fused_attention_counts_its_two_products_by_hand():
    """Q @ K^T and scores @ V: 2 * B * H * L * L * D FLOPs each (a multiply-add is 2), however the kernel is fused."""
    b, h, length, d = 2, 3, 40, 16
    q, k, v = (torch.randn(b, h, length, d) for _ in range(3))
    by_hand = 2 * (2 * b * h * length * length * d)
    assert profile_ops(BareAttention(), (q, k, v), convention="flops").total == by_hand
    with FlopCounterMode(display=False) as plain:  # torch alone: the fused CPU kernel counts nothing
        BareAttention()(q, k, v)
    assert plain.get_total_flops() == 0, "torch now counts the CPU kernel: flops.flop_counter's addition can go"
    with flop_counter() as counted:
        BareAttention()(q, k, v)
    assert counted.get_total_flops() == by_hand


def test_fused_attention_backward_counts_five_products():
    """Backward, as torch counts it: the scores recomputed (a fused kernel keeps none), then the gradients of the
    scores, of V, of Q and of K: five B*H*L*L*D products of 2 FLOPs per multiply-add, after the forward's two."""
    b, h, length, d = 1, 2, 24, 8
    q, k, v = (torch.randn(b, h, length, d, requires_grad=True) for _ in range(3))
    with flop_counter() as counted:
        BareAttention()(q, k, v).sum().backward()
    assert counted.get_total_flops() == (2 + 5) * (2 * b * h * length * length * d)


def test_vit_b16_counts_its_attention():
    """torchvision's ViT-B/16 at 224 px: 35.13 GFLOPs with attention (33.70 without, which a CPU used to give)."""
    vit = pytest.importorskip("torchvision.models").vit_b_16(weights=None)
    report = profile_ops(vit, (1, 3, 224, 224), convention="flops")
    attention = 12 * 2 * (2 * 12 * 197 * 197 * 64)  # 12 blocks, 12 heads of 64, 197 tokens (196 patches + class)
    assert report.total == pytest.approx(35.13e9, rel=1e-3)
    with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as plain, torch.no_grad():
        vit.train()(torch.randn(1, 3, 224, 224))
    assert plain.get_total_flops() == report.total
    assert report.total - attention == pytest.approx(33.70e9, rel=1e-3)
