"""helpers.core.device: choosing the device, the override, and the hardware facts behind '% of peak'."""
from __future__ import annotations

import psutil
import pytest
import torch

from helpers.core import device as dev
from helpers.core.hardware_specs import lookup_gpu


def test_default_device_is_cuda_when_present_else_cpu(monkeypatch):
    monkeypatch.delenv(dev.ENV_VAR, raising=False)
    assert dev.pick_device() == torch.device("cuda" if torch.cuda.is_available() else "cpu")


def test_environment_variable_overrides_the_choice(monkeypatch):
    monkeypatch.setenv(dev.ENV_VAR, "cpu")
    assert dev.pick_device() == torch.device("cpu")


def test_argument_beats_environment_variable(monkeypatch):
    monkeypatch.setenv(dev.ENV_VAR, "not-a-device")
    assert dev.pick_device("cpu") == torch.device("cpu")


def test_malformed_override_says_what_was_wrong_and_what_to_do(monkeypatch):
    monkeypatch.setenv(dev.ENV_VAR, "gpu0")
    with pytest.raises(ValueError) as err:
        dev.pick_device()
    message = str(err.value)
    assert dev.ENV_VAR in message and "'gpu0'" in message and "cuda" in message


def test_cuda_request_without_a_gpu_falls_back_with_a_notice(monkeypatch, capsys):
    monkeypatch.setenv(dev.ENV_VAR, "cuda")
    chosen = dev.pick_device()
    if torch.cuda.is_available():
        assert chosen.type == "cuda"
    else:
        assert chosen == torch.device("cpu")
        assert "No CUDA device here" in capsys.readouterr().out


@pytest.mark.parametrize(
    "flags, per_cycle",
    [({"avx512f", "avx2", "fma"}, 64), ({"avx2", "fma", "avx"}, 32), ({"avx"}, 16), ({"sse2"}, 8), (set(), None)],
)
def test_flops_per_cycle_follows_the_simd_width(flags, per_cycle):
    assert dev.cpu_fp32_flops_per_cycle(flags) == per_cycle


def test_cpu_peak_is_cores_times_clock_times_flops_per_cycle():
    peak = dev.cpu_peak_flops("fp32")
    per_cycle = dev.cpu_fp32_flops_per_cycle(dev.cpu_flags())
    if per_cycle is None or dev.cpu_clock_ghz() is None:
        assert peak is None
    else:
        expected = psutil.cpu_count(logical=False) * dev.cpu_clock_ghz() * 1e9 * per_cycle
        assert peak == pytest.approx(expected)
        assert dev.cpu_peak_flops("fp64") == pytest.approx(expected / 2)


@pytest.mark.parametrize(
    "name, expected, bf16_tflops",
    [
        ("NVIDIA H100 80GB HBM3", "H100 SXM", 989.4),
        ("NVIDIA H100 PCIe", "H100 PCIe", 756),
        ("NVIDIA H200", "H200 SXM", 989.4),
        ("NVIDIA A100-SXM4-80GB", "A100 SXM 80GB", 312),
        ("NVIDIA L40S", "L40S", 362),
        ("NVIDIA L4", "L4", 121),
        ("Tesla T4", "T4", None),
    ],
)
def test_gpu_names_map_to_their_datasheet(name, expected, bf16_tflops):
    spec = lookup_gpu(name)
    assert spec is not None and spec.name == expected
    assert spec.tflops.get("bf16") == bf16_tflops


def test_unknown_gpu_has_no_peak():
    assert lookup_gpu("Imaginary Accelerator 9000") is None


def test_describe_reports_this_machine():
    hardware = dev.describe("cpu")
    assert hardware.ram_bytes == psutil.virtual_memory().total
    assert hardware.logical_cores == psutil.cpu_count()
    assert hardware.gpu_name is None
    text = str(hardware)
    assert "RAM" in text and hardware.cpu_model in text


def test_notice_only_when_the_device_is_not_a_gpu(capsys):
    assert dev.gpu_notice("pinned memory", "cpu").startswith("No GPU here")
    assert capsys.readouterr().out.count("\n") == 1
    if torch.cuda.is_available():
        assert dev.gpu_notice("pinned memory", "cuda") is None


@pytest.mark.parametrize("asked, chosen", [("CPU", "cpu"), (" cuda:1 ", "cuda:1"), ("Mps", "mps")])
def test_device_names_are_read_case_blind(asked, chosen):
    assert dev.normalise_device_name(asked, "DEVICE=") == chosen


def test_a_bad_device_name_names_its_knob_and_the_choices_only(monkeypatch):
    with pytest.raises(ValueError) as err:
        dev.normalise_device_name("gpu", "DEVICE= (make lectures)")
    message = str(err.value)
    assert message.startswith("DEVICE= (make lectures): 'gpu'") and "cuda:N" in message
    assert "xla" not in message and "privateuseone" not in message  # not torch's list of 20 device types
