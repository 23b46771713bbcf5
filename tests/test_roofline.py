"""The roofline: operator counts against independent counters, the roof and the ridge, real measurements, the chart."""
from __future__ import annotations

import math

import matplotlib

matplotlib.use("Agg")

import pytest  # noqa: E402
import torch  # noqa: E402
from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: E402
from torch.utils.flop_counter import FlopCounterMode  # noqa: E402

from helpers.core.device import cpu_native_dtypes  # noqa: E402
from helpers.hardware import (  # noqa: E402
    attention_workload,
    conv_workload,
    default_workloads,
    elementwise_workload,
    matmul_workload,
    measure_bandwidth,
    measure_roofline,
    operator_roofline,
    ridge_point,
    roof,
)
from helpers.hardware.roofline import (  # noqa: E402
    Roofline,
    Roofs,
    Timing,
    bound_by,
    copy_workload,
    device_roofs,
    disturbance_note,
    ieee_fp32,
    intensity_label,
    largest_cache,
    past_cache_mib,
    roofline_point,
)


def counted_flops(workload) -> int:
    """FLOPs of one call of ``workload`` as torch.utils.flop_counter counts them (attention through the math backend,
    whose two batched products the counter sees; the fused CPU kernel is invisible to it)."""
    call = workload.prepare()
    with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter:
        call()
    return counter.get_total_flops()


@pytest.mark.parametrize("workload", [
    matmul_workload(8), matmul_workload(33), conv_workload(2, channels=3, size=7, filters=4, kernel=3),
    conv_workload(1, channels=2, size=6, filters=5, kernel=5), attention_workload(2, heads=3, seq=16, head_dim=8),
], ids=lambda w: w.name)
def test_flops_agree_with_torchs_flop_counter(workload):
    assert workload.flops == counted_flops(workload) > 0


def test_an_add_counts_what_the_profiler_counts_and_relu_one_flop_per_element():
    add = elementwise_workload("add", 1000)
    call = add.prepare()
    with torch.profiler.profile(with_flops=True) as profile:
        call()
    profiled = sum(e.flops for e in profile.key_averages() if e.key == "aten::add")
    assert add.flops == profiled == 1000
    assert elementwise_workload("relu", 1000).flops == 1000  # by the stated convention: one max(x, 0) per element


def test_minimal_bytes_worked_by_hand():
    # a 4x4 matmul reads two 16-element matrices and writes one: 48 elements
    assert matmul_workload(4).bytes == 48 * 4
    assert matmul_workload(4, dtype="fp16").bytes == 48 * 2
    # add over 10 elements: 10 + 10 read, 10 written; relu: 10 read, 10 written
    assert elementwise_workload("add", 10).bytes == 30 * 4
    assert elementwise_workload("relu", 10, dtype="bf16").bytes == 20 * 2
    # conv: input 1x2x5x5 = 50, weights 3x2x3x3 = 54, output 1x3x5x5 = 75 elements
    assert conv_workload(1, channels=2, size=5, filters=3, kernel=3).bytes == (50 + 54 + 75) * 4
    # attention: Q, K, V and the output, 1x2x8x4 = 64 elements each
    assert attention_workload(1, heads=2, seq=8, head_dim=4).bytes == 4 * 64 * 4


def test_element_wise_ops_have_intensity_far_below_one_and_matmul_grows_with_n():
    assert elementwise_workload("add", 10).intensity == pytest.approx(1 / 12)
    assert elementwise_workload("relu", 10).intensity == pytest.approx(1 / 8)
    assert matmul_workload(60).intensity == pytest.approx(10.0)  # 2 n^3 / (3 n^2 x 4 bytes) = n / 6
    assert matmul_workload(600).intensity == pytest.approx(100.0)


def test_roof_is_the_lower_of_peak_and_intensity_times_bandwidth():
    peak, bandwidth = 100.0, 10.0  # ridge at 10 FLOP/byte
    assert ridge_point(peak, bandwidth) == 10.0
    assert roof(2.0, peak, bandwidth) == 20.0
    assert roof(10.0, peak, bandwidth) == 100.0
    assert roof(50.0, peak, bandwidth) == 100.0
    assert bound_by(9.99, 10.0) == "memory"
    assert bound_by(10.0, 10.0) == "compute"


def roofline_from(seconds_by_workload, peak, bandwidth) -> Roofline:
    rows = [roofline_point(w, s, peak, bandwidth) for w, s in seconds_by_workload]
    return Roofline(rows, torch.device("cpu"), "fp32", Roofs(peak, "given", bandwidth, "given"))


def test_the_bound_follows_the_ridge_and_the_verdict_says_so():
    add, big = elementwise_workload("add", 1200), matmul_workload(1024)  # intensity 1/12 and about 171
    fast_memory = roofline_from([(add, 1e-3), (big, 1e-2)], peak=1e12, bandwidth=1e11)  # ridge 10
    assert [r.bound for r in fast_memory.rows] == ["memory", "compute"]
    assert "Memory-bound (FLOP/byte below 10): add" in fast_memory.verdict()
    assert "Compute-bound (FLOP/byte at or above it): matmul n=1024" in fast_memory.verdict()
    slow_memory = roofline_from([(add, 1e-3), (big, 1e-2)], peak=1e12, bandwidth=1e9)  # ridge 1000: both below
    assert [r.bound for r in slow_memory.rows] == ["memory", "memory"]
    assert "Compute-bound (FLOP/byte at or above it): none." in slow_memory.verdict()


def test_a_row_holds_achieved_rate_roof_and_share():
    add = elementwise_workload("add", 1000)  # 1,000 FLOPs over 12,000 bytes
    row = roofline_point(add, 1e-6, peak=1e12, bandwidth=6e9)  # 1 GFLOP/s achieved; roof 0.5 GFLOP/s
    assert row.achieved == pytest.approx(1e9)
    assert row.roof == pytest.approx(5e8)
    assert row.pct_of_roof == pytest.approx(200)
    assert row.achieved_bandwidth == pytest.approx(12e9)
    report = roofline_from([(add, 1e-6), (matmul_workload(64), 1e-3)], peak=1e12, bandwidth=6e9)
    assert "Above their roof: add (200%)" in report.verdict() and "caches serve data faster" in report.verdict()
    assert "understates" not in report.verdict()
    too_fast = roofline_from([(matmul_workload(1024), 1e-3)], peak=1e12, bandwidth=6e9)  # 2.1 TFLOP/s against 1 TFLOP/s
    assert "Above their roof: matmul n=1024 (215%)" in too_fast.verdict() and "understates" in too_fast.verdict()
    assert "caches" not in too_fast.verdict()


def test_closest_to_the_roof_is_named_among_points_under_it_not_above_it():
    """A CPU run printed "Closest to its roof: relu at 171%" (the point furthest above its roof)."""
    add, small, big = elementwise_workload("add", 1200), matmul_workload(64), matmul_workload(256)  # ridge 10: matmuls compute-bound
    report = roofline_from([(add, add.bytes / (1.7 * 1e11)), (small, small.flops / (0.3 * 1e12)), (big, big.flops / (0.9 * 1e12))],
                           peak=1e12, bandwidth=1e11)
    assert "closest to it: matmul n=256 at 90%; furthest below it: matmul n=64 at 30%" in report.verdict()
    assert "Above their roof: add (170%)" in report.verdict()


def test_a_point_within_the_noise_of_its_roof_is_at_it_and_a_big_one_is_not_blamed_on_caches():
    """A CPU run called a 192 MiB add at 102% of its roof "above" it, and blamed caches that cannot hold it."""
    big_add = elementwise_workload("add", past_cache_mib("cpu") * 2**20 // 4)  # 3 arrays, each 4x this CPU's largest cache
    bandwidth = 13.3e9
    at_roof = roofline_from([(big_add, big_add.bytes / (1.02 * bandwidth))], peak=1e12, bandwidth=bandwidth)
    assert "At their roof: add (102%)" in at_roof.verdict() and "Above their roof" not in at_roof.verdict()
    over = roofline_from([(big_add, big_add.bytes / (1.5 * bandwidth))], peak=1e12, bandwidth=bandwidth)
    assert "Above their roof: add (150%)" in over.verdict() and "caches" not in over.verdict()
    rows = [roofline_point(big_add, big_add.bytes / (1.08 * bandwidth), 1e12, bandwidth)]
    noisy = Roofline(rows, torch.device("cpu"), "fp32", Roofs(1e12, "given", bandwidth, "given"), noise=0.1)
    assert "At their roof: add (108%)" in noisy.verdict()  # the bandwidth kernel's own blocks spread 10%


def test_bandwidth_arrays_are_sized_past_the_largest_cache_within_bounds_and_free_memory(monkeypatch):
    import helpers.hardware.roofline as roofline

    cache = largest_cache(torch.device("cpu"))
    mib = past_cache_mib("cpu")
    free = roofline._free_bytes(torch.device("cpu"))
    assert mib in (256, 512, 1024) and (cache is None or mib * 2**20 >= 4 * cache or mib == 1024 or 20 * mib * 2**20 > free)
    monkeypatch.setattr(roofline, "largest_cache", lambda device: 260 * 2**20)  # a server's L3
    monkeypatch.setattr(roofline, "_free_bytes", lambda device: 64 * 2**30)  # and 64 GiB free
    assert past_cache_mib("cpu", at_most=4096) == 2048  # the power of two at or past 4 x 260 MiB
    assert past_cache_mib("cpu") == 1024  # capped
    monkeypatch.setattr(roofline, "_free_bytes", lambda device: 6 * 2**30)  # 6 GiB free: ten 512 MiB arrays fit, not 1 GiB ones
    assert past_cache_mib("cpu") == 512
    monkeypatch.setattr(roofline, "largest_cache", lambda device: 8 * 2**20)  # a laptop's L3: the 256 MiB floor
    assert past_cache_mib("cpu") == 256
    add = next(w for w in default_workloads("cpu") if w.name == "add")
    assert add.bytes == 3 * 256 * 2**20  # element-wise tensors as large as the bandwidth arrays


def test_bad_inputs_say_what_to_do():
    with pytest.raises(ValueError, match="n must be a positive whole number"):
        matmul_workload(0)
    with pytest.raises(ValueError, match="n must be a positive whole number"):
        matmul_workload(2.5)
    with pytest.raises(ValueError, match="use fp32"):
        matmul_workload(8, dtype="tf32")
    with pytest.raises(ValueError, match="use one of add, relu"):
        elementwise_workload("gelu", 8)
    with pytest.raises(ValueError, match="kernel must be odd"):
        conv_workload(1, kernel=2)
    with pytest.raises(ValueError, match="bandwidth must be a positive finite number"):
        roof(1.0, 1e9, 0)
    with pytest.raises(ValueError, match="intensity must be a positive"):
        roof(-1.0, 1e9, 1e9)
    with pytest.raises(ValueError, match="peak must be a positive"):
        ridge_point(float("nan"), 1e9)
    with pytest.raises(ValueError, match="no workloads"):
        measure_roofline([])
    with pytest.raises(ValueError, match="mix dtypes"):
        measure_roofline([matmul_workload(4), matmul_workload(4, dtype="bf16")], "cpu")
    with pytest.raises(ValueError, match="peak must be a positive"):
        measure_roofline([matmul_workload(4)], "cpu", peak=0, bandwidth=1e9)
    with pytest.raises(ValueError, match="matmul_sizes is empty"):
        default_workloads(matmul_sizes=())
    with pytest.raises(ValueError, match="seconds must be a positive"):
        roofline_point(matmul_workload(4), 0.0, 1e9, 1e9)


def test_a_real_measurement_on_this_cpu_is_consistent():
    report = operator_roofline("cpu", matmul_sizes=(16, 128), elementwise_numel=2**16, conv_batch=1, attention_seq=32,
                               attention_batch=1, bandwidth_mib=16, min_run_time=0.01)
    assert [r.name for r in report.rows] == ["matmul n=16", "matmul n=128", "add", "relu", "conv 3x3", "attention L=32"]
    assert report.bandwidth > 0 and "measured" in report.roofs.bandwidth_source
    for row in report.rows:
        assert row.seconds > 0 and math.isclose(row.achieved * row.seconds, row.flops)
        assert row.bound == ("memory" if row.intensity < report.ridge else "compute")
    assert report.find(name="add").bound == "memory"  # 1/12 FLOP/byte is below any ridge the kit can measure
    text = str(report)
    assert "ridge point" in text and "% of roof" in text


def test_without_a_known_peak_the_best_measured_rate_stands_in():
    workloads = [matmul_workload(32, dtype="fp16"), matmul_workload(64, dtype="fp16")]
    report = measure_roofline(workloads, "cpu", peak=None, bandwidth=1e10, min_run_time=0.01)
    if "fp16" in cpu_native_dtypes():
        assert report.roofs.peak_source.startswith("ISA estimate")
    else:
        assert "stands in" in report.roofs.peak_source
        assert report.peak == max(r.achieved for r in report.rows)


def test_measured_bandwidth_is_a_positive_rate_of_a_copy_counted_both_ways():
    assert copy_workload(8).bytes == 2 * 8 * 2**20 and copy_workload(8).flops == 0
    assert 0 < measure_bandwidth("cpu", mib=8, min_run_time=0.01, rounds=1) < float("inf")
    assert device_roofs("cpu").bandwidth is None  # the kit knows no CPU bandwidth: measure_roofline measures it
    assert device_roofs("cpu", bandwidth=5e9).bandwidth_source == "given"


def test_the_chart_has_the_roof_the_ridge_and_every_point():
    add, big = elementwise_workload("add", 1200), matmul_workload(1024)
    report = roofline_from([(add, 1e-3), (big, 1e-2)], peak=1e12, bandwidth=1e11)
    ax = report.plot()
    roofs = [line for line in ax.get_lines() if line.get_label().startswith("roof")]
    assert len(roofs) == 1
    xs, ys = roofs[0].get_xdata(), roofs[0].get_ydata()
    assert report.ridge in list(xs) and max(ys) == report.peak
    for x, y in zip(xs, ys):
        assert y == pytest.approx(min(report.peak, x * report.bandwidth))
    assert any(list(line.get_xdata()) == [report.ridge, report.ridge] for line in ax.get_lines())  # the ridge marker
    plotted = {(round(x, 6), round(y)) for c in ax.collections for x, y in c.get_offsets()}
    assert plotted == {(round(r.intensity, 6), round(r.achieved)) for r in report.rows}
    assert ax.get_xscale() == ax.get_yscale() == "log"
    assert ax.yaxis.get_major_formatter()(1e9, 0) == "1 GFLOP/s"
    assert ax.xaxis.get_major_formatter()(0.125, 0) == "1/8" == intensity_label(0.125)
    assert "FLOP/byte" in ax.get_xlabel()


def test_on_a_gpu_fp32_work_is_timed_in_true_fp32_and_the_settings_come_back():
    """The GPU path's TF32 switch, exercised on the CPU: setting these flags needs no GPU."""
    before = torch.backends.cuda.matmul.fp32_precision, torch.backends.cudnn.conv.fp32_precision
    with ieee_fp32(torch.device("cuda")):
        assert torch.backends.cuda.matmul.fp32_precision == "ieee"
        assert torch.backends.cudnn.conv.fp32_precision == "ieee"
    assert (torch.backends.cuda.matmul.fp32_precision, torch.backends.cudnn.conv.fp32_precision) == before
    with ieee_fp32(torch.device("cpu")):
        assert (torch.backends.cuda.matmul.fp32_precision, torch.backends.cudnn.conv.fp32_precision) == before


def test_a_gpu_gets_larger_default_sizes_and_building_them_allocates_nothing():
    """The GPU's workloads, built on a machine without one: sizes are chosen and counted, no tensor is made."""
    names = [w.name for w in default_workloads(torch.device("cuda"))]
    assert names == ["matmul n=256", "matmul n=1024", "matmul n=4096", "matmul n=8192", "add", "relu", "conv 3x3", "attention L=2048"]
    assert [w.name for w in default_workloads("cpu")][:3] == ["matmul n=64", "matmul n=256", "matmul n=1024"]
    with pytest.raises(ValueError, match="numel must be a positive"):
        default_workloads("cpu", elementwise_numel=0)


def test_a_disturbed_timing_is_named_and_a_steady_one_is_not():
    steady = {"add": Timing(1.0, 1.2), "matmul n=64": Timing(2.0, 2.9)}
    assert disturbance_note(steady, torch.device("cuda")) is None  # a GPU's timings: the CPU's load is not judged
    note = disturbance_note({"add": Timing(1.0, 1.2), "matmul n=64": Timing(2.0, 6.0), "relu": Timing(1.0, 1.6)}, "cuda")
    assert "For 2 of 3 timings" in note and "up to 3.0x, matmul n=64" in note
    on_cpu = disturbance_note(steady, "cpu")  # steady blocks: only a CPU load above its cores can raise a note
    assert on_cpu is None or on_cpu.startswith("The CPU was busy: its 1-minute load average was")
    rows = [roofline_point(matmul_workload(64), 1e-4, 1e12, 1e10)]
    report = Roofline(rows, torch.device("cpu"), "fp32", Roofs(1e12, "given", 1e10, "given"), disturbance=note)
    assert report.verdict().endswith(note)
