"""Every lecture notebook executes top to bottom under papermill (quick profile), and what it measured holds up.

The lectures run two at a time, each in an interpreter of its own (tests/notebook_runs.py); one that compares timings runs alone.

A lecture's last code cell defines ``lesson_figures = {...}`` (see helpers.course.notebooks.LESSON_FIGURES and
ARCHITECTURE.md); ``FIGURE_CHECKS`` checks measured figures of every lecture (each must be named there) against an
invariant of its own: a parity, a count, a size worked by hand, a verdict that must follow from its share.
While a lecture runs, every process it starts (servers, workers, Ray) is watched: none may listen beyond
127.0.0.1, none may outlive the run, and no Ray session folder may stay behind.
"""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from helpers.course.notebooks import find_notebooks

from .notebook_runs import WatchedNotebookRuns, processes_behaved

pytestmark = pytest.mark.notebooks

ROOT = Path(__file__).resolve().parents[1]
LECTURES = find_notebooks(ROOT / "lectures")


def gpu_architecture(f):
    seconds = f["overlap_seconds"]
    copies = seconds.get("copies only (pageable)", seconds["copies only"])  # a GPU's serial loop copies from pageable memory
    slower_part = max(copies, seconds["compute only"])
    # one after the other never beats the slower part alone (10% timing margin) and costs about the two together at most
    assert 0.9 * slower_part < seconds["copy then compute (pageable)"] < 2.5 * (copies + seconds["compute only"]), seconds
    if "non_blocking from pinned memory, side stream" in seconds:  # a GPU: overlapping never beats the slower of its parts either
        assert seconds["non_blocking from pinned memory, side stream"] > 0.9 * max(seconds["copies only"], seconds["compute only"]), seconds


def hardware_ecosystem(f):
    assert f["lenet_param_bytes"] == 4 * f["lenet_parameters"]  # fp32 weights
    assert 2 * f["lenet_param_bytes"] <= f["adam_state_bytes"] <= 2 * f["lenet_param_bytes"] + 1024  # two moments, and step counters
    assert all(v > 0 for v in f["samples_per_second"].values())
    # every device's LeNet learned: five times chance (10%) on digits it never saw (with the course's last ReLU kept, a run
    # could end with most digits dead: 20% on an H100 once, 10-95% over eight seeds on a CPU)
    assert all(0.5 <= accuracy <= 1 for accuracy in f["held_out_accuracy"].values()), f["held_out_accuracy"]
    repaired, as_is = f["defect"]["last ReLU removed"], f["defect"]["as the course has it"]
    assert min(repaired) >= 0.5 and min(repaired) >= min(as_is), f["defect"]  # the repair learns at every seed, and never worse


def gpu_programming_model(f):
    errors = f["kernel_max_errors"]
    assert errors and all(e < 1e-2 for e in errors.values()), errors  # every kernel computes the product torch.matmul does


def web_services(f):
    assert f["load_test_errors"] == 0
    assert all(f["same_answers"])  # gRPC answers what HTTP answers
    sizes = f["request_bytes"]
    assert sizes["gRPC + protobuf"] < sizes["HTTP + JSON"]  # 4 bytes a pixel against its decimal text
    assert f["rejected"]["counted"] == f["rejected"]["sent"]  # the service's counter saw every bad request it refused
    assert f["predicted"]["counted"] == f["predicted"]["answered"]  # and every image it answered, once


def formats_runtimes_batching(f):
    assert all(f["within_tolerance"].values()), f["within_tolerance"]
    sizes = f["file_bytes"]
    assert sizes["ONNX int8"] < 0.5 * sizes["ONNX fp32"]  # one byte a weight against four, plus the graph
    assert f["batching_errors"] == 0
    assert f["engine_errors"] == 0 and f["engines_agree"]  # Ray Serve answers what the kit's batcher answers


def making_models_cheaper(f):
    sizes, nonzero = f["file_bytes"], f["nonzero"]
    assert sizes["dynamic int8"] < 0.5 * sizes["served MLP (fp32)"]
    for name, share in nonzero.items():
        if name.startswith("pruned "):  # "pruned 50%" keeps at most half the weights
            assert share <= 1 - float(name.split()[1].rstrip("%")) / 100 + 0.01, (name, share)
    assert all(0 <= a <= 1 for a in f["accuracy"].values())
    assert f["held_out_digits"] == {"calibration": list(range(10)), "test": list(range(10))}  # both disjoint slices hold every digit
    assert len(f["student_accuracy"]["distilled"]) == len(f["student_accuracy"]["labels only"]) >= 3  # chance taken over seeds


def experiment_tracking(f):
    assert f["runs"] == f["grid"]  # one tracked run per point of the grid
    assert f["chosen_on_validation"] == f["best_on_validation"]  # selection on the validation split
    assert f["champion_run"] == f["chosen_run"] and f["reloaded_predicts_the_same"]
    assert f["reproduced_metric"] == f["recorded_metric"]  # data v1 checked out from the remote retrains to the same figure
    # "a clear lead" only where the leader's worst seed beat every other run's best seed, else "a tie"
    assert f["clear_lead"] == all(best < f["leader_worst_seed"] for best in f["others_best_seeds"]), f


def monitoring_lecture(f):
    assert f["same_seed_same_weights"] is True
    for test, (share, required, passed) in f["behaviour"].items():
        assert passed == (share >= required), test  # the verdict follows the measured share
    drift = f["drift_comparison"]  # rows: brighter by, our drifted features, our verdict, Evidently's drifted columns, its verdict, p gap
    assert all(Path(report).stat().st_size > 100_000 for report in drift["reports"])  # Evidently wrote its HTML for every batch
    assert all(gap < 1e-9 for *_, gap in drift["rows"])  # the same KS test per column
    assert all(evidently == (columns >= drift["columns"] / 2) and ours == (features > 0) for _, features, ours, columns, evidently, _ in drift["rows"])
    assert drift["rows"][0][2:5:2] == [False, False] and drift["rows"][-1][2:5:2] == [True, True]  # no drift; clear drift (+0.2)


def os_distributed_recap(f):
    tolerance = f["fit_tolerance"]
    for n, errors in f["model_errors"].items():  # the printed verdict follows from the errors printed beside it
        assert f["fits"][n] == all(1 / tolerance <= e <= tolerance for e in errors.values()), (n, errors)
    assert f["extrapolated"] == all(f["fits"].values())  # seconds are extrapolated only from a model that fits every N
    for n, least, most, formula, correct in f["traffic"]:  # every worker sends one gradient, the server N - 1 of them
        assert correct and least == formula and most == (n - 1) * formula, (n, least, most, formula)
    for n, sent, formula in f["server_traffic"]:  # the server, itself a worker, sends the sum to the N - 1 others
        assert sent == formula, (n, sent, formula)
    assert f["bytes_hold"]
    for n, ratio in f["time_ratio"].items():  # "follows the byte ratio" only where the measured time ratio lies within the tolerance of it
        assert f["times_follow_bytes"][n] == (1 / tolerance <= ratio / f["byte_ratio"][n] <= tolerance), (n, ratio, f["byte_ratio"][n])


def data_parallel_training(f):
    tolerance = f["fit_tolerance"]
    for n, errors in f["butterfly_errors"].items():
        assert f["butterfly_fits"][n] == all(1 / tolerance <= e <= tolerance for e in errors.values()), (n, errors)
    for n, error in f["scaling_errors"].items():
        assert f["scaling_fits"][n] == (1 / tolerance <= error <= tolerance), (n, error)
    assert f["extrapolated"] == (all(f["scaling_fits"].values()) and all(f["butterfly_fits"].values()))
    noise = f["bucket_noise"]
    for cap, (buckets, first_pct, low, high) in f["buckets"].items():  # a verdict needs the whole range past the noise
        assert f["bucket_verdicts"][cap] == ("hid" if low > noise else "slower" if high < -noise else "tie"), (cap, low, high, noise)
        if float(cap) > f["gradient_mib"]:  # a cap above the whole gradient: one bucket, launched when backward ends
            assert buckets == 1 and first_pct == pytest.approx(100), (cap, buckets, first_pct)
    overlap = f["overlap"]
    assert overlap["hid"] == (min(overlap["saved"]) > overlap["noise"])
    assert f["replicas_equal_after_wrap"] is True


def serving_language_models(f):
    kv = f["kv_bytes_per_token"]
    assert kv["gqa"] == 2 * kv["layers"] * kv["kv_heads"] * kv["head_dim"] * kv["element_bytes"]  # keys and values, every layer
    assert kv["heads"] == 3 * kv["kv_heads"] and kv["mha"] == 3 * kv["gqa"]  # 9 query heads share 3 key/value heads
    assert f["logit_gap"] < 1e-3 and f["cache_identical"] is True  # the cells' model is the engine's; the cache changes no token
    static, continuous = f["batching"]["static"], f["batching"]["continuous"]
    assert continuous["steps"] < static["steps"]  # continuous batching fills the slots static batching leaves idle
    cont_tps, static_tps = continuous["tokens_per_s"], static["tokens_per_s"]
    assert len(cont_tps) == len(static_tps) >= 3  # a timed verdict is taken over repeats
    expected = ("continuous" if min(cont_tps) > max(static_tps) else "static" if min(static_tps) > max(cont_tps) else "a tie")
    assert f["batching_verdicts"][0].startswith(expected), (f["batching_verdicts"], cont_tps, static_tps)
    paging = f["paging"]
    assert paging["paged"]["peak"] > paging["reserved"]["peak"]  # the same blocks hold more sequences when taken as they grow
    assert paging["paged"]["preemptions"] > 0 == paging["reserved"]["preemptions"] == paging["roomy pool"]["preemptions"]
    assert paging["paged"]["prefill_tokens"] > paging["roomy pool"]["prefill_tokens"]  # a preempted sequence is computed again
    assert f["preempted_identical"] is True
    prefix = f["prefix"]
    computed, prompt = prefix["prefill_tokens"], prefix["prompt_tokens"]
    assert computed["off"] <= prompt["off"] and computed["on"] < computed["off"]
    # with the cache, every prompt token not found there is computed (the engine leaves a one-token remainder uncounted)
    assert 0 <= prompt["on"] - prefix["hits"] - computed["on"] <= len(prefix["ttft_s"]["on"])
    assert 0 < prefix["hit_rate"] <= 1 and prefix["hit_rate"] == pytest.approx(prefix["hits"] / prompt["on"])
    faster = max(prefix["ttft_s"]["on"][1:]) < min(prefix["ttft_s"]["off"][1:])
    assert prefix["verdict"].startswith("faster" if faster else "not faster")
    whole, chunked = f["chunked"]["whole prompt"]["itl_max_s"], f["chunked"]["chunked"]["itl_max_s"]
    assert len(whole) == len(chunked) >= 3  # the longest stall, over repeats in turns
    expected = "chunks of" if max(chunked) < min(whole) else "the whole prompt" if max(whole) < min(chunked) else "a tie"
    assert f["chunked_verdict"].startswith(expected), (f["chunked_verdict"], whole, chunked)
    spec = f["speculative"]
    assert spec["identical"] is True and 0 <= spec["accepted_tokens"] <= spec["draft_tokens"] > 0
    assert spec["acceptance"] == spec["accepted_tokens"] / spec["draft_tokens"]
    plain, drafted = spec["seconds"]["speculate=0"], spec["seconds"]["speculate=k"]
    assert len(plain) == len(drafted) >= 3
    assert spec["verdict"].startswith("faster" if max(drafted) < min(plain) else "slower" if min(drafted) > max(plain) else "a tie")
    quantised = f["quantisation"]
    int8, int4 = quantised["int8 weights"], quantised["int4 weights"]
    (base,) = [row for name, row in quantised.items() if not name.startswith("int")]  # fp32 (bf16 on a GPU)
    assert base["top1_agreement"] == 1 and base["kl"] < 1e-6
    assert int4["bytes"] < int8["bytes"] < base["bytes"]
    assert int8["top1_agreement"] >= 0.9 and int8["kl"] < int4["kl"]  # 8 bits per weight keep the model; 4 bits cost more
    for row in (int8, int4):  # a speed verdict needs every run of one side to beat every run of the other
        assert len(row["seconds"]) == len(base["seconds"]) >= 3
        expected = ("faster" if max(row["seconds"]) < min(base["seconds"]) else
                    "slower" if min(row["seconds"]) > max(base["seconds"]) else "a tie")
        assert row["verdict"].startswith(expected), (row["verdict"], row["seconds"], base["seconds"])
    assert f["server_matches"] is True  # the server answers what the cells' engine answers, streamed or not


def data_loading_and_elastic_training(f):
    reads = f["reads_per_sample"]  # each reader reads all it is given: unsplit, every reader reads every sample
    assert reads == {"none": f["readers"], "ranks only": f["loader_workers"], "ranks and workers": 1}, reads
    assert f["exactly_once"] is True and f["orders_agree"] is True
    assert f["torn_share"]["save_atomically"] == 0, f["torn_share"]  # a rename never leaves a half-written checkpoint to read
    assert f["restarts"] == 1 and f["resumed_at"] == f["last_checkpoint"], (f["restarts"], f["resumed_at"], f["last_checkpoint"])
    assert f["weights_equal"] is True and f["losses_equal"] is True  # step, weights and optimizer state are all a run carries


def memory_efficient_training(f):
    assert f["accumulation_same"] and all(same in (True, None) for same in f["accumulation_same"]), f["accumulation_same"]
    p, m = f["stages"], f["micro_batches"]
    for name, run in f["schedules"].items():  # equal stages on an ideal clock: the bubble is the formula's
        assert run["bubble"] == pytest.approx(run["formula"]) == pytest.approx((p - 1) / (m + p - 1)), (name, run)
    assert f["schedules"]["GPipe"]["held"] == [m] * p  # every micro-batch's activations until its backward
    assert f["schedules"]["1F1B"]["held"] == [min(p - s, m) for s in range(p)]  # stage s holds at most p - s
    assert f["pipeline_same_gradients"] and all(f["pipeline_same_gradients"]), f["pipeline_same_gradients"]
    assert max(f["split_layer_differences"].values()) <= 1e-5, f["split_layer_differences"]  # a split layer is the layer
    assert f["mlp_equal"] is True and f["gelu_before_sum_equal"] is False  # the sum must come before the nonlinearity
    assert all(f["towers_same_gradients"]) and f["towers_output_difference"] <= 1e-4, f["towers_output_difference"]


def mixed_precision_and_data_pipelines(f):
    runs = f["padding"]  # whole data set padded, per batch, length buckets: the same sequences, fewer padded positions
    real = [r["tokens"] * (1 - r["padding_share"]) for r in runs]
    assert all(count == pytest.approx(real[0], rel=1e-9) for count in real), real
    assert [r["tokens"] for r in runs] == sorted((r["tokens"] for r in runs), reverse=True) and runs[0]["tokens"] > runs[-1]["tokens"], runs
    assert runs[0]["speedup"] == 1.0 and all(r["speedup"] == pytest.approx(runs[0]["epoch_seconds"] / r["epoch_seconds"]) for r in runs)
    assert ("as fast." in f["bucketing_sentence"]) == (runs[-1]["speedup"] >= 1.15), (f["bucketing_sentence"], runs[-1])


def profiling_and_compilation(f):
    from helpers.training.launch_overhead import COMPILED, EAGER, GRAPH, GRAPH_NEEDS_GPU

    rows = {r["variant"]: r for r in f["launch"]}
    eager, compiled = rows[EAGER], rows[COMPILED]
    assert eager["speedup"] == 1.0 and eager["max_difference"] == 0, eager
    if compiled["call_seconds"] is not None:  # compiled within its budget: the same numbers, faster or not
        assert compiled["max_difference"] <= 1e-5 and compiled["speedup"] == pytest.approx(eager["call_seconds"] / compiled["call_seconds"]), compiled
    if not torch.cuda.is_available():
        assert rows[GRAPH]["call_seconds"] is None and GRAPH_NEEDS_GPU in rows[GRAPH]["note"], rows[GRAPH]


RAY_LECTURE = "07-formats-runtimes-batching.ipynb"  # starts Ray Serve
RUN_ALONE = {"01-gpu-architecture-and-benchmarking.ipynb"}  # its figure check compares timings taken in one run

def arithmetic_fusion_and_compile(f):
    flops = f["flops"]
    assert abs(flops["counted"] / (flops["six_nt"] + flops["attention"]) - 1) < 0.05, flops  # 6·N·T plus attention's products
    assert 0 < f["mfu"] < 1.5, f["mfu"]
    timeline = f["timeline"]
    assert timeline["phases"] == ["forward", "backward", "optimizer step", "zero_grad"], timeline
    assert abs(timeline["end"] - timeline["optimizer_state"]) <= 0.01 * timeline["optimizer_state"] < timeline["peak"], timeline  # AdamW's state stays
    assert f["graphs"] == {"with the print": 2, "fixed": 1} and f["breaks"] == {"with the print": 1, "fixed": 0}, (f["graphs"], f["breaks"])
    assert f["compilations"] == {"dynamic=False": 4, "default": 2, "dynamic=True": 1, "mark_dynamic": 1}, f["compilations"]
    rms, swiglu = f["fusion"]["RMSNorm"], f["fusion"]["SwiGLU"]
    assert rms["compiled kernels"] == 1 < rms["eager kernels"] and swiglu["compiled kernels"] == 3 < 1 + swiglu["eager kernels"], f["fusion"]
    assert max(rms["max_difference"], swiglu["max_difference"]) < 1e-4, f["fusion"]
    loss = f["fused_loss"]
    assert loss["max_difference"] < 1e-4, loss  # the same loss and gradients
    assert loss["peak"]["chunked, fused"] < loss["logits_bytes"] <= loss["peak"]["plain"] / 2, loss  # the logits never whole
    optimizer = f["optimizer"]
    assert optimizer["max_difference"] < 1e-5 and optimizer["seconds"]["fused"] < optimizer["seconds"]["Python loop"], optimizer


def flash_attention(f):
    tolerance = 2e-2 if f["device"] == "cuda" else 1e-4  # float16 on a GPU's Triton check, float32 elsewhere
    errors = f["max_errors"]
    assert errors and max(errors.values()) <= 1e-4, errors  # plain, tiled (causal too) and split-KV decoding all compute SDPA's attention
    assert f["triton_error"] is None or f["triton_error"] <= tolerance, f["triton_error"]
    rows = {(r["method"], r["n"]): r for r in f["sweep"]}
    largest = max(n for _, n in rows)
    plain_rows = [row for (method, _), row in rows.items() if method == "plain"]
    assert all(row["peak_bytes"] >= row["scores_bytes"] for row in plain_rows), plain_rows  # plain holds its whole score matrix at once
    tiled, plain = rows[("tiled", largest)], rows[("plain", largest)]
    assert tiled["peak_bytes"] < plain["scores_bytes"] / 4 and tiled["peak_bytes"] < plain["peak_bytes"] / 4, (tiled, plain)  # no n x n matrix


def kv_cache_compression(f):
    def named(figures, prefix):  # the figures come back with their keys sorted: find each by the start of its name
        return next(value for name, value in figures.items() if name.startswith(prefix))

    mha, gqa, mqa = (named(f["bytes_per_token"], p) for p in ("MHA", "GQA", "MQA"))
    assert mha * f["kv_heads"] == gqa * f["heads"] and gqa == mqa * f["kv_heads"], f["bytes_per_token"]
    base, int8, int4 = (named(f["quantised"], p) for p in ("fp32", "int8", "int4")) if "fp32 cache" in f["quantised"] else \
        (named(f["quantised"], p) for p in ("bf16", "int8", "int4"))
    assert base["bytes"] > 3 * int8["bytes"] > 3 * int4["bytes"], f["quantised"]  # one byte (or half) a value, plus a scale per head
    assert base["agreement"] == 1 and int8["perplexity"] < 1.02 * base["perplexity"] < int4["perplexity"], f["quantised"]  # int8 costs little; int4 shows
    whole, window_only, with_sinks = (named(f["eviction"], p) for p in ("whole", "window", f"{f['sinks']} sinks"))
    assert whole < with_sinks < window_only, f["eviction"]  # evicting costs, and the sink tokens take back most of it
    assert f["text_tokens"] > 2 * (f["window"] + f["sinks"])  # the text is long enough that the window evicts
    for name, v in f["verdicts"].items():  # each printed verdict follows from its gap and the noise printed beside it
        expected = "higher" if v["gap"] > v["two_stderr"] else "lower" if v["gap"] < -v["two_stderr"] else "a tie"
        assert v["verdict"] == expected, (name, v)
    assert named(f["verdicts"], "int4")["verdict"] == "higher", f["verdicts"]  # 4 bits a value cost more than the noise
    assert named(f["verdicts"], f"window of {f['window']} vs whole")["verdict"] == "higher", f["verdicts"]


FIGURE_CHECKS = {
    "01-gpu-architecture-and-benchmarking.ipynb": gpu_architecture,
    "02-hardware-ecosystem.ipynb": hardware_ecosystem,
    "02-os-and-distributed-recap.ipynb": os_distributed_recap,
    "03-data-parallel-training.ipynb": data_parallel_training,
    "03b-data-loading-and-elastic-training.ipynb": data_loading_and_elastic_training,
    "03-gpu-programming-model.ipynb": gpu_programming_model,
    "04-memory-efficient-training.ipynb": memory_efficient_training,
    "05a-mixed-precision-and-data-pipelines.ipynb": mixed_precision_and_data_pipelines,
    "05b-profiling-and-compilation.ipynb": profiling_and_compilation,
    "05c-arithmetic-fusion-and-compile.ipynb": arithmetic_fusion_and_compile,
    "06-web-services.ipynb": web_services,
    "07-formats-runtimes-batching.ipynb": formats_runtimes_batching,
    "08-making-models-cheaper.ipynb": making_models_cheaper,
    "08b-serving-language-models.ipynb": serving_language_models,
    "08c-flash-attention.ipynb": flash_attention,
    "08d-kv-cache-compression.ipynb": kv_cache_compression,
    "09-experiment-tracking.ipynb": experiment_tracking,
    "10-testing-debugging-monitoring.ipynb": monitoring_lecture,
}


def test_the_kit_has_lecture_notebooks():
    assert LECTURES, "no notebooks under lectures/"
    assert set(FIGURE_CHECKS) <= {p.name for p in LECTURES}, "a figure check names a lecture that is gone: rename it with the lecture"
    unchecked = sorted(p.name for p in LECTURES if p.name not in FIGURE_CHECKS)
    assert not unchecked, f"lectures whose figures nothing checks: {unchecked}; give each a check in FIGURE_CHECKS"


@pytest.fixture(scope="module")
def lecture_runs(request, tmp_path_factory):
    """The selected lectures queued at once, two at a time, each in a process of its own that is watched."""
    selected = [item.callspec.params["notebook"] for item in request.session.items
                if getattr(item, "originalname", "") == "test_lecture_runs_and_its_figures_hold"]
    runs = WatchedNotebookRuns(selected, tmp_path_factory.mktemp("lectures"), ROOT / "lectures", {"quick": True},
                               alone=[nb for nb in selected if nb.name in RUN_ALONE])
    yield runs
    runs.close()


@pytest.mark.parametrize("notebook", LECTURES, ids=[str(p.relative_to(ROOT / "lectures")) for p in LECTURES])
def test_lecture_runs_and_its_figures_hold(notebook, lecture_runs):
    run, started = lecture_runs.result(notebook)
    if run["status"] != "ok":
        pytest.fail(f"{notebook.name} failed after {run['seconds']:.0f} s:\n{run['error']}", pytrace=False)
    processes_behaved(started)
    if notebook.name == RAY_LECTURE:
        assert started.session_folders, "the Ray Serve demo ran but no Ray session was seen: the watcher missed it"
    check = FIGURE_CHECKS.get(notebook.name)
    if check is not None:
        assert run["figures"] is not None, f"{notebook.name} defines no lesson_figures: its last code cell must (see ARCHITECTURE.md)"
        check(run["figures"])


def test_lecture_10_runs_to_the_end_without_prometheus(tmp_path, monkeypatch):
    """Where Prometheus cannot be installed, section 6 says so in one line and the lecture runs on (as a GPU section does)."""
    import os

    from helpers.course.notebooks import execute_notebook

    tools = tmp_path / "bin"  # every program on PATH but Prometheus's two
    tools.mkdir()
    for folder in filter(None, os.environ["PATH"].split(os.pathsep)):
        for program in Path(folder).glob("*") if Path(folder).is_dir() else []:
            if program.name not in ("prometheus", "promtool") and not (tools / program.name).exists():
                (tools / program.name).symlink_to(program)
    monkeypatch.setenv("PATH", str(tools))
    lecture = next(nb for nb in LECTURES if nb.name == "10-testing-debugging-monitoring.ipynb")
    run = execute_notebook(lecture, tmp_path / "out", parameters={"quick": True}, root=ROOT / "lectures", html=False)
    assert run.status == "ok", run.error
    printed = run.output.read_text()
    assert "no Prometheus, so this section's alerts do not run here" in printed and "skipped: no Prometheus" in printed
    monitoring_lecture(run.figures)  # the rest of the lecture's figures hold as with Prometheus
