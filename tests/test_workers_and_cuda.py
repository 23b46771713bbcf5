"""helpers.core.workers on a GPU box, checked on the CPU: no worker inherits CUDA state, ranks never share a GPU.

A notebook kernel has always touched CUDA before a distributed demo starts; a worker forked from such a
process cannot use the GPU. These tests fake the GPU side (device counts, CUDA's initialised flag, a CUDA
driver that must not be called) so that a regression fails here, on a machine without one.
"""
from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
import torch.distributed as dist

from helpers.core import workers
from helpers.core.workers import plan_ranks, worker_context

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("gpus, world, backend, devices", [
    (0, 2, "gloo", ("cpu", "cpu")),
    (1, 1, "cpu:gloo,cuda:nccl", ("cuda:0",)),
    (1, 2, "gloo", ("cpu", "cpu")),          # make ddp-demo NPROC=2 on a one-GPU machine
    (2, 2, "cpu:gloo,cuda:nccl", ("cuda:0", "cuda:1")),
    (8, 4, "cpu:gloo,cuda:nccl", ("cuda:0", "cuda:1", "cuda:2", "cuda:3")),
    (2, 4, "gloo", ("cpu",) * 4),
])
def test_ranks_get_a_gpu_each_or_all_go_to_the_cpu(monkeypatch, gpus, world, backend, devices):
    monkeypatch.setattr(dist, "is_nccl_available", lambda: True)
    plan = plan_ranks(world, gpus=gpus)
    assert (plan.backend, plan.devices) == (backend, devices)
    assert len(set(d for d in plan.devices if d != "cpu")) == sum(d != "cpu" for d in plan.devices), "two ranks share a GPU"
    assert ("NCCL" in plan.reason) == (backend != "gloo") and "\n" not in plan.reason


def test_the_plan_counts_the_visible_gpus_when_not_told(monkeypatch):
    monkeypatch.setattr(workers.torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(workers.torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(dist, "is_nccl_available", lambda: True)
    assert plan_ranks(2).backend == "gloo" and "1 GPU for 2 ranks" in plan_ranks(2).reason
    assert plan_ranks(1).devices == ("cuda:0",)


def test_an_explicit_nccl_with_too_few_gpus_is_a_clear_error():
    with pytest.raises(ValueError, match="one GPU per rank"):
        workers.launch(print, 2, backend="nccl", echo=False)


def test_workers_are_never_forked_from_the_caller():
    with pytest.raises(ValueError, match="never forked"):
        worker_context("fork")
    assert worker_context().get_start_method() in ("forkserver", "spawn")


def test_the_forkserver_preload_never_calls_the_cuda_driver():
    """torch.utils.benchmark (say) asks the driver for a device count at import: in the preload it would poison every worker."""
    script = textwrap.dedent(f"""
        import importlib, torch
        def refuse(*args, **kwargs):
            raise RuntimeError("the CUDA driver was called while importing the forkserver preload")
        torch._C._cuda_getDeviceCount = refuse
        torch.cuda._lazy_init = refuse
        for name in {workers._PRELOAD!r}:
            importlib.import_module(name)
        print("clean")
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "clean", out.stderr[-2000:]


def test_a_caller_that_initialised_cuda_still_gets_usable_workers():
    """The parent marks CUDA initialised (as a kernel that used the GPU has); workers must not be a bad fork of it."""
    script = textwrap.dedent("""
        import torch
        from helpers.core.workers import launch
        torch.cuda._initialized = True   # what torch records after the kernel's first CUDA call
        def state():
            import torch
            return torch.cuda._is_in_bad_fork(), torch.cuda.is_initialized()
        print(launch(state, 2, echo=False, timeout=120))
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "[(False, False), (False, False)]"
