"""Lecture 5c's apparatus: kernels counted eagerly and in Inductor's code, and the allocator's timeline of a step."""
from __future__ import annotations

import pytest
import torch

from helpers.core import allocation_timeline
from helpers.training import count_launches, eager_kernels, inductor_code


def _rms_norm(x, weight):
    return (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * weight).view(-1)  # the view launches nothing


def test_eager_calls_one_kernel_per_operation_and_compiled_rms_norm_is_one_generated_kernel():
    x, weight = torch.randn(8, 32), torch.randn(32)
    assert eager_kernels(_rms_norm, x, weight) == ["pow", "mean", "add", "rsqrt", "mul", "mul"]
    torch._dynamo.reset()
    compiled = torch.compile(_rms_norm)
    output, code = inductor_code(compiled, x, weight)
    assert torch.allclose(output, _rms_norm(x, weight), atol=1e-5)
    assert len(code.generated) == 1 and code.library == [] and code.kernels == 1, code.generated
    assert code.kernel_source(lines=3).startswith(f"{code.generated[0]} = async_compile")
    assert inductor_code(compiled, x, weight)[1] == code  # a later call reads the same code
    with pytest.raises(RuntimeError, match="pass a function compiled with torch.compile"):
        inductor_code(_rms_norm, x, weight)
    torch._dynamo.reset()
    assert count_launches(_rms_norm, x, weight) is None  # no GPU launches to count on a CPU
    assert count_launches(lambda: 1 / 0, device="cpu") is None  # nor is the function called there


def test_the_timeline_shows_each_phase_and_what_stays_live():
    kept = {}
    phases = {"allocate": lambda: kept.update(a=torch.ones(2**20), b=torch.ones(2**20)),  # 8 MiB
              "free one": lambda: kept.pop("a"),
              "temporary": lambda: (kept["b"] * 2).sum()}
    timeline = allocation_timeline(phases)
    assert list(timeline.phases) == list(phases) and sorted(timeline.phases.values()) == list(timeline.phases.values())
    assert timeline.peak >= 8 * 2**20 and timeline.live_bytes[-1] == 4 * 2**20, (timeline.peak, timeline.live_bytes[-4:])
    assert timeline.html is None and timeline.milliseconds == sorted(timeline.milliseconds)
