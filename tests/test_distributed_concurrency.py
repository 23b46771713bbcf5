"""helpers.distributed.concurrency: the GIL demo, shared memory between processes and loaders run and report what they claim."""
from __future__ import annotations

from helpers.core.report import startswith
from helpers.distributed.concurrency import DecodeHeavy, dataloader_demo, gil_demo, python_work, shared_memory_demo, start_costs


def test_shared_memory_passes_a_handle_and_the_child_writes_through():
    demo = shared_memory_demo(mib=4)
    copy, shared = demo.rows
    assert copy.pickled_bytes >= 4 * 2**20 and not copy.parent_sees_change
    assert shared.pickled_bytes < 4096 and shared.parent_sees_change


def test_gil_demo_runs_every_method_on_both_workloads():
    demo = gil_demo(tasks=2, python_iterations=20_000, matrix=32, matmuls=2)
    assert len(demo.rows) == 6 and all(r.seconds > 0 for r in demo.rows)
    assert demo.find(work="pure Python", method=startswith("serial")).speedup == 1.0
    demo.plot()


def test_loaders_return_every_item():
    dataset = DecodeHeavy(length=10, decode_iterations=10)
    assert [int(dataset[i][0, 0, 0]) for i in range(10)] == list(range(10))
    assert python_work(10) == sum(i * i % 7 for i in range(10))
    demo = dataloader_demo(length=16, decode_iterations=100, batch_size=4, workers=2)
    assert [r.loader.split(",")[0] for r in demo.rows] == ["DataLoader", "2 threads", "DataLoader"]


def test_start_costs_list_threads_and_processes():
    costs = start_costs(include_spawn=False)
    assert costs.rows[0].what == "thread" and len(costs.rows) == 2 and all(r.seconds > 0 for r in costs.rows)
