"""Hand-written collectives on real gloo groups, the traffic they cause, and the cost formulas they follow."""
from __future__ import annotations

import sys

import cloudpickle
import pytest
import torch
import torch.distributed as dist

from helpers.core.workers import launch
from helpers.distributed.collectives import count_traffic, parameter_server_all_reduce, ring_all_reduce
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
from helpers.distributed.experiments import all_reduce_sweep, calibrate_link, collectives_demo, traffic_check

pytestmark = pytest.mark.slow

cloudpickle.register_pickle_by_value(sys.modules[__name__])


def compare_with_torch(shapes):
    rank = dist.get_rank()
    out = []
    for shape in shapes:
        data = torch.randn(shape, generator=torch.Generator().manual_seed(100 * rank + len(out)))
        expected = data.clone()
        dist.all_reduce(expected)
        ring = ring_all_reduce(data.clone())
        average = ring_all_reduce(data.clone(), average=True)
        server = parameter_server_all_reduce(data.clone())
        out.append(torch.allclose(ring, expected, atol=1e-5) and torch.allclose(average, expected / dist.get_world_size(), atol=1e-5)
                   and torch.allclose(server, expected, atol=1e-5))
    return out


@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
def test_ring_and_parameter_server_match_dist_all_reduce(world_size):
    shapes = [(1,), (5,), (1001,), (3, 7)]  # fewer elements than ranks, sizes not divisible by N, 2-D
    results = launch(compare_with_torch, world_size, args=(shapes,), echo=False)
    assert all(all(r) for r in results), results


def ring_traffic(numel):
    with count_traffic() as traffic:
        ring_all_reduce(torch.ones(numel))
    return dict(traffic.bytes_to), traffic.messages


def test_the_ring_talks_only_to_its_right_neighbour_and_sends_2_n_minus_1_over_n():
    world, numel = 4, 1000
    per_rank = launch(ring_traffic, world, args=(numel,), echo=False)
    for rank, (bytes_to, messages) in enumerate(per_rank):
        assert set(bytes_to) == {(rank + 1) % world}
        assert messages == 2 * (world - 1)
        assert bytes_to[(rank + 1) % world] == pytest.approx(bytes_sent_per_worker("ring", numel * 4, world), abs=2 * 4)


def test_ring_refuses_a_non_contiguous_tensor():
    def body():
        ring_all_reduce(torch.ones(4, 4).t())
    with pytest.raises(Exception, match="contiguous"):
        launch(body, 2, echo=False)


def test_counting_restores_dist_send():
    original = dist.send
    with count_traffic():
        assert dist.send is not original
    assert dist.send is original


def test_traffic_check_agrees_with_the_formulas():
    report = traffic_check(world_sizes=(2, 3), numel=999)
    for row in report.rows:
        assert row.correct
        if row.scheme.startswith("ring"):
            assert abs(row.most_sent_by_a_rank - row.formula_per_worker) <= 8
        else:  # the server (rank 0) sends the sum to each of the N-1 workers
            assert row.most_sent_by_a_rank == (row.world_size - 1) * row.message_bytes
            assert row.least_sent_by_a_rank == row.formula_per_worker == row.message_bytes


def test_collectives_demo_shows_the_four_operations():
    demo = collectives_demo(3)
    ops = {r.operation.split()[0] for r in demo.rows}
    assert ops == {"broadcast", "all_reduce", "all_gather", "reduce_scatter"}
    after = {(r.operation.split()[0], r.rank): r.after for r in demo.rows}
    assert after[("all_gather", 2)] == "[0, 1, 2]" and after[("broadcast", 2)] == "[1, 1]"


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
    sweep = all_reduce_sweep(world_sizes=(2,), sizes_bytes=(1024, 256 * 1024), repeats=2, link=calibration.link)
    assert len(sweep.rows) == 4 and all(r.seconds > 0 and r.model_seconds > 0 for r in sweep.rows)
    sweep.plot()
    sweep.plot_world_sizes()
