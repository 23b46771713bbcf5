"""Hand-written collectives on real gloo groups, the traffic they cause, and the cost formulas they follow."""
from __future__ import annotations

import sys
import threading

import cloudpickle
import pytest
import torch
import torch.distributed as dist

from helpers.core.workers import launch
from helpers.distributed.collectives import all_reduce_calls, collective_calls, count_traffic, point_to_point_only, sends_scaled
from helpers.distributed.comm_models import (
    SCHEMES,
    Link,
    all_reduce_time,
    busiest_node_bytes,
    bytes_sent_per_worker,
    comm_costs,
    epoch_bytes,
    fit_link,
    rounds,
)
from helpers.distributed.experiments import all_reduce_sweep, calibrate_link, traffic_check

pytestmark = pytest.mark.slow

cloudpickle.register_pickle_by_value(sys.modules[__name__])


def server_all_reduce(tensor):
    """A parameter-server all-reduce from send/recv: rank 0 sums what everyone sends and sends the sum back."""
    world, rank = dist.get_world_size(), dist.get_rank()
    if rank == 0:
        inbox = torch.empty_like(tensor)
        for peer in range(1, world):
            dist.recv(inbox, peer)
            tensor += inbox
        for request in [dist.isend(tensor, peer) for peer in range(1, world)]:
            request.wait()
    else:
        dist.send(tensor, 0)
        dist.recv(tensor, 0)
    return tensor


def wrong_all_reduce(tensor):
    """Sends like a parameter server but forgets to add: traffic_check must say the result is wrong."""
    if dist.get_rank() == 0:
        for request in [dist.isend(tensor, peer) for peer in range(1, dist.get_world_size())]:
            request.wait()
    else:
        dist.recv(tensor, 0)
    return tensor


def test_traffic_check_counts_a_cells_all_reduce_against_its_formula():
    report = traffic_check({"parameter server": server_all_reduce, "mine": wrong_all_reduce}, world_sizes=(2, 3), numel=999)
    for row in report.rows:
        if row.scheme == "parameter server":  # the server (rank 0) sends the sum to each of the N-1 workers
            assert row.correct
            assert row.most_sent_by_a_rank == (row.world_size - 1) * row.message_bytes
            assert row.least_sent_by_a_rank == row.formula_per_worker == row.message_bytes
            assert row.server_sent == row.server_formula == (row.world_size - 1) * row.message_bytes and row.server_holds
        else:  # no formula for an unknown scheme, and the wrong sum is reported as wrong
            assert not row.correct and row.formula_per_worker != row.formula_per_worker


def in_another_thread(call):
    """``call`` run on a thread of its own; what it raised is raised here."""
    import concurrent.futures
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(call).result()


def in_a_raw_thread(call):
    """``call`` on a thread started with _thread, below the threading module."""
    import _thread
    done, outcome = threading.Event(), []

    def run():
        try:
            outcome.append(call())
        except BaseException as error:  # noqa: BLE001 - handed back to the caller
            outcome.append(error)
        done.set()
    _thread.start_new_thread(run, ())
    done.wait()
    if isinstance(outcome[0], BaseException):
        raise outcome[0]
    return outcome[0]


def routes_to_collectives():
    """Each route to a collective, tried under point_to_point_only: which raised, and whether send/recv still work."""
    import torch.distributed.distributed_c10d as c10d
    import torch.distributed.nn.functional as dist_nn
    x = torch.ones(3)
    routes = {
        "dist.all_reduce": lambda: dist.all_reduce(x),
        "distributed_c10d.all_reduce": lambda: c10d.all_reduce(x),
        "the group's own allreduce": lambda: c10d._get_default_group().allreduce([x]).wait(),
        "torch.distributed.nn all_reduce": lambda: dist_nn.all_reduce(x),
        "broadcast_object_list": lambda: dist.broadcast_object_list([1], 0),
        "barrier": lambda: dist.barrier(),
        "all_reduce from a thread pool": lambda: in_another_thread(lambda: dist.all_reduce(x)),
        "broadcast from a raw thread": lambda: in_a_raw_thread(lambda: dist.broadcast(x, 0)),
    }
    refused = {}
    for name, call in routes.items():
        with point_to_point_only():
            try:
                call()
                refused[name] = False
            except RuntimeError as error:
                refused[name] = "not allowed" in str(error)
    with point_to_point_only(), count_traffic() as traffic:
        server_all_reduce(x)
    after = torch.ones(2)
    in_another_thread(lambda: dist.all_reduce(after))  # the collectives' own kernels answer again after the block
    return refused, dict(traffic.bytes_to), x.tolist(), after.tolist()


def test_point_to_point_only_refuses_every_route_to_a_collective_and_lets_send_recv_through():
    for rank, (refused, sent, summed, after) in enumerate(launch(routes_to_collectives, 2, echo=False)):
        assert all(refused.values()), refused
        assert summed == [2.0, 2.0, 2.0]
        assert sent == {1 - rank: 12}
        assert after == [2.0, 2.0]


def send_through_c10d(numel):
    import torch.distributed.distributed_c10d as c10d
    with count_traffic() as traffic:
        if dist.get_rank() == 0:
            c10d.isend(torch.ones(numel), 1).wait()
            c10d.send(torch.ones(2 * numel), 1)
        else:
            c10d.recv(torch.empty(numel), 0)
            c10d.recv(torch.empty(2 * numel), 0)
    return dict(traffic.bytes_to), traffic.messages


def test_count_traffic_sees_sends_by_any_route():
    assert launch(send_through_c10d, 2, args=(10,), echo=False) == [({1: 120}, 2), ({}, 0)]


def file_all_reduce(tensor, folder):
    """A sum passed through files, with the traffic of a parameter server sent alongside and ignored."""
    from pathlib import Path
    world, rank = dist.get_world_size(), dist.get_rank()
    torch.save(tensor.clone(), Path(folder) / f"{rank}.pt")
    server_all_reduce(torch.zeros_like(tensor))  # messages go, and double as a barrier: every file is written
    tensor.copy_(sum(torch.load(Path(folder) / f"{peer}.pt") for peer in range(world)))
    return tensor


def scaled_runs(folder):
    """Two all-reduces and two plain messages with every send doubled, then one all-reduce as usual."""
    rank, results = dist.get_rank(), {}
    with sends_scaled(2.0):
        results["parameter server"] = server_all_reduce(torch.full((3,), rank + 1.0)).tolist()
        results["through files"] = file_all_reduce(torch.full((3,), rank + 1.0), folder).tolist()
        floats, integers = torch.full((2,), 5.0 - 5 * rank), torch.tensor([7, 8]) * (1 - rank)
        if rank == 0:  # sent from a pool thread: the scaling holds process-wide
            in_another_thread(lambda: (dist.send(floats, 1), dist.send(integers, 1)))
        else:
            dist.recv(floats, 0)
            dist.recv(integers, 0)
        results["floats"], results["integers"] = floats.tolist(), integers.tolist()
    results["after the block"] = server_all_reduce(torch.full((3,), rank + 1.0)).tolist()
    return results


def test_sends_scaled_changes_what_messages_carry_and_nothing_else(tmp_path):
    for rank, results in enumerate(launch(scaled_runs, 2, args=(str(tmp_path),), echo=False)):
        # rank 0 sums 1 + 2 x 2 (rank 1's message, doubled) and sends that back doubled: 5 and 10
        assert results["parameter server"] == [[5.0, 10.0][rank]] * 3
        assert results["through files"] == [3.0] * 3  # the files carried the sum: the scaling cannot reach it
        assert results["floats"] == [[5.0, 5.0], [10.0, 10.0]][rank]  # the sender keeps its own; the receiver gets double
        assert results["integers"] == [7, 8]  # integers travel unchanged
        assert results["after the block"] == [3.0] * 3


def all_reduces_by_every_route():
    """All-reduces by three routes (one on a pool thread) under all_reduce_calls, doubled, then one after the block."""
    import torch.distributed.distributed_c10d as c10d
    x, y, z = torch.ones(3), torch.ones(5), torch.ones(2, dtype=torch.float64)
    with all_reduce_calls(scale=2.0) as calls:
        dist.all_reduce(x)
        in_another_thread(lambda: c10d._get_default_group().allreduce([y]).wait())
        dist.all_reduce(z, async_op=True).wait()
    after = torch.ones(1)
    dist.all_reduce(after)
    return calls, x.tolist(), y.tolist(), z.tolist(), after.tolist()


def test_all_reduce_calls_records_and_scales_every_route_in_every_thread():
    for calls, x, y, z, after in launch(all_reduces_by_every_route, 2, echo=False):
        assert calls == [12, 20, 16]  # float32 x 3, float32 x 5, float64 x 2
        assert x == [4.0] * 3 and y == [4.0] * 5 and z == [4.0] * 2  # each rank's 1 doubled, summed over two ranks
        assert after == [2.0]


def collectives_in_forward_and_backward():
    """Collectives of every kind, by several routes (a differentiable all-reduce's backward too), then sends."""
    import torch.distributed.nn.functional as dist_nn
    x = torch.ones(3, requires_grad=True)
    with collective_calls() as forward:
        y = dist_nn.all_reduce(x * 2)
        dist.all_gather([torch.zeros(3) for _ in range(dist.get_world_size())], torch.ones(3))
        in_another_thread(lambda: dist.broadcast(torch.ones(2), src=0))
        dist.barrier()
    with collective_calls() as backward:
        y.sum().backward()
    import torch.distributed._functional_collectives as functional
    with collective_calls() as traced:
        functional.wait_tensor(functional.all_reduce(torch.ones(2), "sum", dist.group.WORLD))
    forward += traced
    with collective_calls() as messages:
        if dist.get_rank() == 0:
            dist.send(torch.ones(1), 1)
        else:
            dist.recv(torch.zeros(1), 0)
    return forward, backward, messages, x.grad.tolist()


def test_collective_calls_names_every_collective_and_no_message():
    for forward, backward, messages, grad in launch(collectives_in_forward_and_backward, 2, echo=False):
        assert forward == ["c10d::allreduce_", "c10d::allgather_", "c10d::broadcast_", "c10d::barrier", "_c10d_functional::all_reduce"]
        assert backward == ["c10d::allreduce_"]  # the all-reduce's backward is an all-reduce of the gradient
        assert messages == [] and grad == [4.0] * 3


# ---------------------------------------------------------------- the cost formulas


@pytest.mark.parametrize("m,n,k", [(1e6, 2, 10), (4e6, 8, 50), (123.0, 64, 7)])
def test_epoch_totals_are_the_lectures_2mnk_and_2m_n_minus_1_k(m, n, k):
    assert epoch_bytes("parameter server", m, n, k) == pytest.approx(2 * m * n * k)
    assert epoch_bytes("ring", m, n, k) == pytest.approx(2 * m * (n - 1) * k)


def test_the_ring_is_bandwidth_optimal_and_the_server_is_the_bottleneck():
    m = 1e6
    per_worker = [bytes_sent_per_worker("ring", m, n) for n in (2, 4, 16, 1024)]
    assert per_worker == sorted(per_worker) and per_worker[-1] < 2 * m  # tends to 2M, never reaches it
    server = [busiest_node_bytes("parameter server", m, n) for n in (2, 4, 8)]
    assert server[1] == 2 * server[0] and server[2] == 2 * server[1]  # grows linearly with N
    assert busiest_node_bytes("ring", m, 64) < busiest_node_bytes("tree", m, 64) < busiest_node_bytes("parameter server", m, 64)
    assert rounds("ring", 8) == 14 and rounds("tree", 8) == 6 and rounds("butterfly", 8) == 3
    assert all(rounds(s, 1) == 0 for s in SCHEMES if s != "parameter server")


def test_alpha_beta_times_show_latency_and_bandwidth_regimes():
    link = Link(alpha=1e-4, beta=1e-9)
    small, large = 1e3, 1e9
    assert all_reduce_time("butterfly", small, 64, link) < all_reduce_time("ring", small, 64, link)  # few rounds win
    assert all_reduce_time("ring", large, 64, link) < all_reduce_time("butterfly", large, 64, link)  # few bytes win
    assert all_reduce_time("ring", large, 4, link) == pytest.approx(6 * (1e-4 + large / 4 * 1e-9))


def test_fit_link_recovers_alpha_and_beta():
    sizes = [4, 4096, 65536, 1 << 20, 8 << 20]
    link = fit_link(sizes, [2e-5 + b * 5e-10 for b in sizes])
    assert link.alpha == pytest.approx(2e-5, rel=1e-3) and link.beta == pytest.approx(5e-10, rel=1e-3)
    with pytest.raises(ValueError, match="two different"):
        fit_link([8, 8], [1.0, 1.0])


def test_comm_costs_table_and_unknown_scheme():
    costs = comm_costs(1e6, workers=(2, 8), link=Link(1e-5, 1e-9))
    assert costs.find(scheme="ring", workers=8).seconds == pytest.approx(all_reduce_time("ring", 1e6, 8, Link(1e-5, 1e-9)))
    assert "parameter server" in costs.table()
    lines = {line.get_label(): dict(zip(line.get_xdata(), line.get_ydata())) for line in costs.plot().lines}
    assert set(lines) == {"parameter server", "ring", "tree", "butterfly"}
    # worked by hand for 1 MB of gradients: the server takes in and sends out one copy per worker, 2 x 8 x 1 MB at N = 8;
    # a ring node sends and receives 2 (N - 1) / N of the buffer each way, 2 x 2 x 7/8 x 1 MB
    assert lines["parameter server"][8] == pytest.approx(16e6) and lines["ring"][8] == pytest.approx(3.5e6)
    with pytest.raises(ValueError, match="unknown scheme"):
        rounds("gossip", 4)


def test_measured_sweep_and_calibration_report_positive_times():
    calibration = calibrate_link(sizes_bytes=(4, 64 * 1024, 1 << 20), repeats=3)
    assert calibration.link.alpha >= 0 and calibration.link.bandwidth > 1e6
    assert all(r.error == pytest.approx(r.seconds / r.model_seconds) for r in calibration.rows)  # the fit's error at every size
    sweep = all_reduce_sweep({"parameter server": server_all_reduce}, world_sizes=(2,), sizes_bytes=(1024, 256 * 1024), repeats=2, link=calibration.link)
    assert len(sweep.rows) == 4 and all(r.seconds > 0 for r in sweep.rows)
    assert all((r.model_seconds > 0) == (r.implementation == "parameter server") for r in sweep.rows if r.model_seconds is not None)
    assert {r.implementation for r in sweep.rows if r.model_seconds} == {"parameter server"}
    assert all(r.fastest <= r.seconds <= r.slowest for r in sweep.rows)
    for r in sweep.rows:  # the model's error compares the fastest round with the model, and only where there is a model
        assert (r.error is None) == (r.model_seconds is None) and (r.error is None or r.error == pytest.approx(r.fastest / r.model_seconds))
    assert set(sweep.model_errors("parameter server")[2]) == {1024, 256 * 1024}
    sweep.plot()
    sweep.plot_world_sizes()
