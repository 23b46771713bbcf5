"""helpers.core.torch_adapters: every private torch API the kit relies on is still where its adapter expects it.

When a torch upgrade moves one, the test for its adapter fails with a message naming the
torch API that changed and the adapter file to update; nothing else in helpers/ touches them.
"""
from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest
import torch
from torch import nn

from helpers.core.torch_adapters import (
    ADAPTERS,
    TorchAPIChanged,
    changes,
    check_all,
    dispatch,
    fake_tensor,
    mem_tracker,
    optim_defaults,
    profiler_memory,
    storage,
)

HELPERS = Path(__file__).resolve().parents[1] / "helpers"
PRIVATE_TORCH = re.compile(r"torch\._|_cdata|\._schema|kineto|distributed\._tools|utils\._[a-z]|_C\._|nn\.modules\.\w+\._")


@pytest.mark.parametrize("adapter", ADAPTERS)
def test_each_adapter_finds_what_it_relies_on_in_this_torch(adapter):
    importlib.import_module(f"helpers.core.torch_adapters.{adapter}").check()


def test_check_all_runs_every_adapter():
    assert check_all() == list(ADAPTERS)
    on_disk = {p.stem for p in (HELPERS / "core" / "torch_adapters").glob("*.py")} - {"__init__", "changes"}
    assert on_disk == set(ADAPTERS), "every adapter module is listed in ADAPTERS, so check_all and this test run it"


def test_a_moved_api_is_named_with_the_torch_version_and_the_adapter_to_fix():
    with pytest.raises(TorchAPIChanged) as missing_name:
        changes.require("storage", "torch.utils", "_no_such_private_helper")
    message = str(missing_name.value)
    assert "torch.utils._no_such_private_helper" in message
    assert f"torch {torch.__version__}" in message and "helpers/core/torch_adapters/storage.py" in message
    with pytest.raises(TorchAPIChanged, match=r"torch\._no_such_module cannot be imported"):
        changes.require("fake_tensor", "torch._no_such_module")


def test_no_module_outside_the_adapters_uses_a_private_torch_api():
    offenders = []
    for path in HELPERS.rglob("*.py"):
        if "torch_adapters" in path.parts or "course" in path.parts:  # course/ only names torch._dynamo, to preload it in the sandbox
            continue
        for number, line in enumerate(path.read_text().splitlines(), start=1):
            code = line.split("#")[0]
            if PRIVATE_TORCH.search(code) and "torch.__version__" not in code:
                offenders.append(f"{path.relative_to(HELPERS.parent)}:{number}: {line.strip()}")
    assert not offenders, "private torch APIs belong in helpers/core/torch_adapters/:\n" + "\n".join(offenders)


def test_storage_keys_tell_shared_memory_from_copies_for_real_and_fake_tensors():
    x = torch.zeros(4, 4)
    assert storage.storage_key(x[1:].view(-1)) == storage.storage_key(x)
    assert storage.storage_key(x.clone()) != storage.storage_key(x)
    with fake_tensor.new_fake_mode():
        fake = torch.empty(8)
        relu_in_place = nn.ReLU(inplace=True)(fake)
        assert fake_tensor.is_fake(fake)
        assert storage.storage_key(relu_in_place) == storage.storage_key(fake)
        assert storage.storage_key(fake + 1) != storage.storage_key(fake)


def test_view_operators_are_told_from_computing_ones():
    aten = torch.ops.aten
    assert dispatch.is_view(aten.view.default) and dispatch.is_view(aten.t.default)
    assert not dispatch.is_view(aten.add.Tensor) and not dispatch.is_view(aten.mm.default)


def test_the_allocator_peak_follows_allocations_and_frees_in_order():
    events = [(0, 100), (1, 50), (2, -100), (3, 70), (4, -120)]  # live: 100, 150, 50, 120, 0
    assert profiler_memory.peak_of(events) == 150
    assert profiler_memory.peak_of([]) == 0


def test_memtracker_kinds_map_to_the_kits_names_and_an_unknown_kind_is_reported():
    snapshot = {"Parameter": 10, "Buffer": 1, "Gradient": 10, "Optstate": 20, "Activation": 30, "Temp": 2, "Other": 3, "Total": 76}
    named = mem_tracker.by_kind(snapshot)
    assert named == {"parameters": 10, "buffers": 1, "gradients": 10, "optimizer state": 20, "activations": 30,
                     "temporaries": 2, "other": 3, "total": 76}
    with pytest.raises(TorchAPIChanged, match="_MemRefType.*Mystery"):
        mem_tracker.by_kind({"Mystery": 5})


def test_a_tracked_forward_and_backward_reports_its_gradients_and_module_peaks():
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
    params = (16 * 32 + 32 + 32 * 4 + 4) * 4
    tracker = mem_tracker.new_step_tracker()
    tracker.track_external(model)
    with tracker:
        tracker.phase = "forward"
        loss = model(torch.ones(8, 16)).sum()
        tracker.phase = "backward"
        loss.backward()
    assert mem_tracker.peak_by_kind(tracker)["cpu"]["parameters"] == params
    assert tracker.timeline[-1][1]["cpu"]["gradients"] == params  # after backward every parameter has its gradient
    assert {phase for phase, _ in tracker.timeline} == {"forward", "backward"}
    whole = next(row for row in mem_tracker.module_peaks(tracker) if row.fqn == "Sequential")
    assert whole.parameter_bytes == params and whole.backward_peak >= 2 * params


def test_optimizers_default_to_foreach_kernels_only_on_accelerators():
    assert not optim_defaults.foreach_by_default([torch.zeros(2)])
    assert not optim_defaults.foreach_by_default([])
