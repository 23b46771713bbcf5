"""helpers.core.models: the lecture's LeNet, the MLP, and AlexNet (2012) whole and split."""
from __future__ import annotations

import pytest
import torch
from torchvision.models import alexnet as torchvision_alexnet

from helpers.core.models import ALEXNET_INPUT, BasicFCModel, LeNet, alexnet_2012, count_parameters


def test_lenet_layers_and_shapes():
    model = LeNet()
    names = [name for name, _ in model.named_children()]
    assert names == ["conv1", "relu1", "pool1", "conv2", "relu2", "pool2", "fc1", "relu3", "fc2", "relu4", "fc3", "relu5"]
    assert (model.fc1.in_features, model.fc2.in_features, model.fc3.in_features) == (256, 120, 60)
    out = model(torch.randn(4, 1, 28, 28))
    assert out.shape == (4, 10) and (out >= 0).all()  # the last ReLU is part of this variant


def test_basic_fc_model():
    model = BasicFCModel(256)
    assert count_parameters(model) == 784 * 256 + 256 + 256 * 10 + 10
    assert model(torch.randn(3, 1, 28, 28)).shape == (3, 10)


def test_alexnet_2012_has_the_papers_parameter_count():
    assert count_parameters(alexnet_2012()) == 60_965_224
    assert count_parameters(alexnet_2012(split=True)) == 60_965_224
    assert count_parameters(torchvision_alexnet()) == 61_100_840  # the later one-tower variant differs


def test_alexnet_2012_shapes():
    model = alexnet_2012().eval()
    x = torch.randn(2, *ALEXNET_INPUT)
    assert model.features(x).shape == (2, 256, 6, 6)
    assert model(x).shape == (2, 1000)


def test_split_towers_compute_the_same_function_as_the_grouped_model():
    torch.manual_seed(0)
    whole = alexnet_2012(num_classes=10).eval()
    split = alexnet_2012(split=True, num_classes=10).eval().load_from(whole)
    x = torch.randn(2, *ALEXNET_INPUT)
    torch.testing.assert_close(split(x), whole(x), rtol=1e-4, atol=1e-5)


def test_split_towers_hold_half_of_each_layer():
    split = alexnet_2012(split=True)
    assert count_parameters(split.towers[0]) == count_parameters(split.towers[1]) == 60_965_224 // 2
    with pytest.raises(ValueError, match="one device per tower"):
        split.place("cpu")
    assert split.place("cpu", "cpu") is split


def test_split_needs_an_even_number_of_classes():
    with pytest.raises(ValueError, match="even"):
        alexnet_2012(split=True, num_classes=7)
