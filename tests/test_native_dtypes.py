"""The number-format sentence: what the machine reports about fp16/bf16, and the measured time against fp32."""
from __future__ import annotations

import re

import pytest

from helpers.core.device import cpu_flags, cpu_native_dtypes
from helpers.hardware import dtype_speed
from helpers.hardware.native_dtypes import speed_sentence, support_evidence


def test_native_and_faster_is_said_as_a_gain():
    text = speed_sentence("cuda", "fp16", True, "compute capability 9.0", 0.1, 4096)
    assert "native arithmetic (compute capability 9.0)" in text and "ran 10.0x faster than fp32" in text
    assert "emulated" not in text


def test_without_instructions_and_far_slower_is_said_as_emulation():
    text = speed_sentence("cpu", "fp16", False, "no avx512_fp16 or amx_fp16 CPU flag", 60.0, 256)
    assert "finds no native arithmetic" in text and "took 60.0x fp32's time" in text and "emulated" in text


def test_without_instructions_and_a_little_slower_is_not_called_emulation():
    text = speed_sentence("cpu", "fp16", False, "no avx512_fp16 or amx_fp16 CPU flag; F16C converts only", 1.4, 256)
    assert "took 1.4x fp32's time" in text and "saves memory here, not time" in text
    assert "emulated" not in text


def test_native_but_not_faster_and_unsupported_but_faster_say_so():
    assert "did not make it faster" in speed_sentence("cpu", "fp16", True, "CPU flag amx_fp16", 1.0, 64)
    assert "did not make it faster" in speed_sentence("cpu", "bf16", True, "CPU flag avx512_bf16", 2.0, 64)
    assert "support the kit does not know of" in speed_sentence("cpu", "fp16", False, "no flag", 0.5, 64)
    with pytest.raises(ValueError, match="must be positive"):
        speed_sentence("cpu", "fp16", False, "no flag", 0.0, 64)


def test_this_cpus_evidence_names_the_flags_it_reads():
    flags = cpu_flags()
    for dtype, wanted in (("fp16", ("avx512_fp16", "amx_fp16")), ("bf16", ("avx512_bf16", "amx_bf16"))):
        native, evidence = support_evidence("cpu", dtype)
        assert native == (dtype in cpu_native_dtypes())
        assert native == any(f in flags for f in wanted)
        assert all(f in evidence for f in wanted) if not native else any(f in evidence for f in wanted)
    with pytest.raises(ValueError, match="fp16"):
        support_evidence("cpu", "fp8")


def test_a_real_comparison_prints_one_sentence_per_format_that_matches_its_row():
    report = dtype_speed(n=32, device="cpu", min_run_time=0.01, rounds=1)
    assert [(r.device, r.dtype) for r in report.rows] == [("cpu", "fp32"), ("cpu", "bf16"), ("cpu", "fp16")]
    assert report.find(dtype="fp32").speedup_vs_fp32 == 1.0
    lines = report.sentences().splitlines()
    assert [line.split()[0] for line in lines[:2]] == ["bf16", "fp16"]
    assert lines[2:] == ([report.disturbance] if report.disturbance else [])
    for line, row in zip(lines, report.rows[1:]):
        shown = float(re.search(r"([\d.]+)x", line).group(1))
        expected = row.speedup_vs_fp32 if "faster" in line.split(":")[1] else 1 / row.speedup_vs_fp32
        assert shown == pytest.approx(expected, abs=0.051)
        assert ("finds no native" in line) == (not row.native)


def test_bad_formats_are_refused():
    with pytest.raises(ValueError, match="one or more of bf16, fp16"):
        dtype_speed(n=8, dtypes=("fp8",))
    with pytest.raises(ValueError, match="one or more of bf16, fp16"):
        dtype_speed(n=8, dtypes=())
    with pytest.raises(ValueError, match="n must be a positive whole number"):
        dtype_speed(n=0)
