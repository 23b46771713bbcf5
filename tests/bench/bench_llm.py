"""The kit's language model served, side by side with what a user would pick instead, by vLLM's serving-benchmark method.

One run, one machine, one thread count: the kit's engine (continuous and static batching, in process through
``AsyncEngine``), transformers' ``generate`` as a static-batch server (batch 1 and larger batches), and llama.cpp
(llama-cpp-python, one sequence at a time, on the 4-bit GGUF file itself) serve the same chat requests at the same
arrival times; then the engine's features, each with and without: paging, prefix caching, chunked prefill,
speculative decoding. fp32 on a CPU, bf16 on a GPU.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from helpers.core.device import dtype_name, pick_device
from helpers.core.load import OtherLoad, in_fresh_thread, record, take_load_note
from helpers.serving import llama as llama_module
from helpers.serving.llama import load_llm
from helpers.serving.llm_bench import (
    QUESTIONS,
    SLO,
    DecodeReport,
    DecodeRow,
    EngineServer,
    LlamaCppServer,
    ServingReport,
    StaticBatchServer,
    absent_row,
    chat_prompts,
    chat_workload,
    chunked_prefill_runs,
    decode_rate,
    drive,
    engine_decode_times,
    llama_cpp_decode_times,
    load_llama_cpp,
    paging_runs,
    prefix_runs,
    speculative_runs,
    summarise,
    transformers_decode_times,
)
from helpers.serving.llm_engine import Engine
from helpers.serving.smollm import gguf_path, load_tokenizer

from . import BenchResult, Target, full_runs_only

MAX_BATCH = 16                     # the engine's running batch, and the largest static batch tried
# Goodput's objective: on a 2-core CPU the first token within 2 s and then 200 ms a token (about reading speed);
# on a GPU 0.5 s and 50 ms.
SLOS = {"cpu": SLO(ttft=2.0, tpot=0.2), "cuda": SLO(ttft=0.5, tpot=0.05)}
# Questions whose answers are short (they end early) and long (they run to max_tokens): the mix paging is for.
PAGING_QUESTIONS = ["Answer with one word: what colour is grass?", "What is 2 + 2? Reply with the number only.",
                    "Write a short poem about the sea.", "Say hello.", "Explain how a CPU cache works.",
                    "Name one fruit.", "Tell me a story about a dragon.", "Yes or no: is water wet?"]
COPY_TEXT = ("The quick brown fox jumps over the lazy dog. Packing my box with five dozen liquor jugs was a "
             "good idea, said the wizard, who then quickly jinxed the gnomes before they vaporized.")
COPY_CODE = '''def moving_average(values, window):
    """The mean of each run of `window` consecutive values."""
    if window < 1:
        raise ValueError("window must be at least 1")
    total = sum(values[:window])
    means = [total / window]
    for i in range(window, len(values)):
        total += values[i] - values[i - window]
        means.append(total / window)
    return means
'''


@dataclass
class Setup:
    """What every measurement shares: the device, thread count, the kit's model, transformers' copy, llama.cpp."""

    device: torch.device
    threads: int
    model: object
    tokenizer: object
    reference: object                   # transformers' model on the same file
    llama_cpp: object | None
    llama_cpp_note: str                 # why llama.cpp is absent, or how it runs here

    @property
    def llama_cpp_runs(self) -> str:
        """How llama.cpp runs, for its rows' notes."""
        where = "on the CPU (a CPU build)" if self.device.type == "cuda" else ""
        return "; ".join(filter(None, ["4-bit Q4_1 file, natively", where, self.llama_cpp_note]))

    @property
    def precision(self) -> str:
        return dtype_name(self.model.embed.weight.dtype)


def load_reference(device: torch.device):
    """transformers' model from the same GGUF file (dequantised by transformers): fp32 on a CPU, bf16 on a GPU."""
    from transformers import AutoModelForCausalLM

    path = gguf_path()
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    return AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=dtype).to(device).eval()


def load_setup() -> Setup:
    device = pick_device()
    threads = torch.get_num_threads()
    llm, note = load_llama_cpp(gguf_path(), threads)
    return Setup(device, threads, load_llm(device), load_tokenizer(), load_reference(device), llm, note)


def timed(section):
    """Run ``section()`` (which returns a report) in a fresh thread, noting how long it took and how busy other programs
    kept the CPU meanwhile (the report's notes say both). The main thread computes nothing, so no system pays for an
    OpenMP team another thread left behind (``in_fresh_thread``)."""
    start = time.perf_counter()
    with OtherLoad() as load:
        report = in_fresh_thread(section)
    record(load.cores)
    report.notes.append(f"Measured in {time.perf_counter() - start:.0f} s; other programs kept {load.cores:.1f} of the CPU's cores busy.")
    report.notes += filter(None, [take_load_note()])   # the kit's sentence on timings taken beside other work
    return report


# --- batch-1 decode ---------------------------------------------------------------------------------------------------
def batch1_decode(setup: Setup, quick: bool) -> DecodeReport:
    tokens, rounds = (8, 1) if quick else (128, 3)
    prompt = setup.tokenizer.encode_chat([{"role": "user", "content": "Tell me a long story about a robot who learns to paint."}])
    systems = {"kit engine": lambda: engine_decode_times(setup.model, prompt, tokens),
               "transformers generate": lambda: transformers_decode_times(setup.reference, prompt, tokens)}
    if setup.llama_cpp is not None:
        systems["llama.cpp"] = lambda: llama_cpp_decode_times(setup.llama_cpp, prompt, tokens)
    for measure in systems.values():   # warm-up: first calls allocate
        measure()
    runs: dict[str, list[float]] = {name: [] for name in systems}
    for _ in range(rounds):            # taking turns, so that other work on the machine hits each alike
        for name, measure in systems.items():
            runs[name].append(decode_rate(measure()))
    base = max(runs["transformers generate"])
    rows = []
    for name, rates in runs.items():
        best = max(rates)
        note = setup.llama_cpp_runs if name == "llama.cpp" else f"{setup.precision}, dequantised from the Q4_1 file"
        rows.append(DecodeRow(name, tokens, best, 1e3 / best, best / base, note, rates))
    if setup.llama_cpp is None:
        rows.append(DecodeRow("llama.cpp", tokens, None, None, None, f"absent: {setup.llama_cpp_note}"))
    notes = [f"{setup.device.type}, {setup.threads} threads for every system; best of {rounds} alternating run(s); "
             f"prompt of {len(prompt)} tokens, {tokens} tokens generated (end of sequence ignored)."]
    return DecodeReport(rows, notes)


# --- serving ----------------------------------------------------------------------------------------------------------
def serving(setup: Setup, workload, load: str, batch_sizes, slo: SLO, title: str) -> ServingReport:
    """Every system on ``workload``; transformers once per static batch size."""
    engines = {"kit engine, continuous": "continuous", "kit engine, static": "static"}
    rows = []
    for name, scheduler in engines.items():
        server = EngineServer(Engine(setup.model, scheduler=scheduler, max_batch=MAX_BATCH))
        rows.append(_serve(name, server, workload, load, slo, f"max_batch {MAX_BATCH}, {setup.precision}"))
    for size in batch_sizes:
        server = StaticBatchServer(setup.reference, size)
        rows.append(_serve(f"transformers generate, B={size}", server, workload, load, slo, f"static batches, {setup.precision}"))
    if setup.llama_cpp is not None:
        rows.append(_serve("llama.cpp", LlamaCppServer(setup.llama_cpp), workload, load, slo, "one sequence at a time; " + setup.llama_cpp_runs))
    else:
        rows.append(absent_row("llama.cpp", load, setup.llama_cpp_note))
    report = ServingReport(rows, [
        f"{len(workload)} chat requests ({len(QUESTIONS)} questions in turn), max_tokens drawn from "
        f"{sorted({r.max_tokens for r in workload})} (seed 0), greedy; {load}. {setup.device.type}, {setup.threads} threads "
        f"for every system. Goodput: requests/s with {slo}. llama.cpp runs the 4-bit GGUF file natively; the kit's "
        f"engine and transformers run it dequantised to {setup.precision}."])
    report.title = title
    return report


def _serve(name: str, server, workload, load: str, slo: SLO, note: str):
    try:
        timelines = drive(server, workload)
    finally:
        server.close()
    return summarise(name, load, timelines, slo, note)


def warm_up(setup: Setup, prompts) -> None:
    """One short request through each system, so no table counts first-call allocations."""
    workload = chat_workload(prompts[:8], 8, max_tokens=[4])
    servers = [EngineServer(Engine(setup.model)), StaticBatchServer(setup.reference, 8)]
    if setup.llama_cpp is not None:
        servers.append(LlamaCppServer(setup.llama_cpp))
    for server in servers:
        _serve("", server, workload, "", SLO(math.inf, math.inf), "")


# --- engine features ----------------------------------------------------------------------------------------------------
def feature_reports(setup: Setup, quick: bool):
    """Paging, prefix caching, chunked prefill and speculative decoding, each with and without (smaller when quick)."""
    tok, model = setup.tokenizer, setup.model
    source = tok.encode(Path(llama_module.__file__).read_text())    # the kit's model code: long, fixed text
    paging_prompts = chat_prompts(tok, (PAGING_QUESTIONS + QUESTIONS)[:6 if quick else 16])
    paging = timed(lambda: paging_runs(model, paging_prompts, max_tokens=40 if quick else 128, num_blocks=12 if quick else 64,
                                       small_pool=6 if quick else 20))

    system = "You are a helpful assistant for a course on efficient deep learning. Here is the course's model code:\n" + \
        tok.decode(source[:450])
    questions = QUESTIONS[:3] if quick else QUESTIONS[:8]
    shared = [tok.encode_chat([{"role": "system", "content": system}, {"role": "user", "content": q}]) for q in questions]
    prefix = timed(lambda: prefix_runs(model, shared, max_tokens=4 if quick else 16, rate=1.0 if quick else 0.5))

    stream_prompts = chat_prompts(tok, QUESTIONS[:3])
    code = tok.decode(source[:300 if quick else 1000])
    long_prompt = tok.encode_chat([{"role": "user", "content": "Summarise this code:\n" + code}])
    chunked = timed(lambda: chunked_prefill_runs(model, stream_prompts, long_prompt, [None, 64] if quick else [None, 128, 64],
                                                 stream_tokens=16 if quick else 48, arrive_after=6 if quick else 8))

    tasks = {"copy this code": f"Repeat this code exactly, without changes:\n```python\n{COPY_CODE}```",
             "fix this text": f"Rewrite this text, correcting nothing else than its spelling:\n{COPY_TEXT.replace('quick', 'quikc')}",
             "plain chat": "Tell me a long story about a robot who learns to paint."}
    prompts = {name: tok.encode_chat([{"role": "user", "content": text}]) for name, text in tasks.items()}
    speculative = timed(lambda: speculative_runs(model, prompts, max_tokens=16 if quick else 128, k=4, rounds=1 if quick else 2))
    return paging, prefix, chunked, speculative


# --- targets ---------------------------------------------------------------------------------------------------------------
def ratio(a, b):
    return None if a is None or b in (None, 0) else a / b


def strictly_below(what: str, measured: float | None, bound: float) -> Target:
    if measured is None:
        return Target(what, None, f"< {bound:g}", "n/a")
    return Target(what, measured, f"< {bound:g}", "pass" if measured < bound else "fail")


def serving_targets(decode: DecodeReport, saturated: ServingReport, poisson: ServingReport) -> list[Target]:
    engine, hf = decode.find(system="kit engine"), decode.find(system="transformers generate")
    cont, static = saturated.find(system="kit engine, continuous"), saturated.find(system="kit engine, static")
    hf_rows = [r for r in saturated.rows if r.system.startswith("transformers") and r.output_tps]
    best_hf = max(hf_rows, key=lambda r: r.output_tps)
    p_cont, p_static = poisson.find(system="kit engine, continuous"), poisson.find(system="kit engine, static")
    return [
        Target.at_least("batch-1 decode tok/s: kit engine / transformers", ratio(engine.rate, hf.rate), 1.0, "x"),
        Target.at_least("saturation output tok/s: continuous / static (kit engine)", ratio(cont.output_tps, static.output_tps), 1.5, "x"),
        Target.at_least(f"saturation output tok/s: continuous / transformers' best static ({best_hf.system})",
                        ratio(cont.output_tps, best_hf.output_tps), 2.0, "x"),
        strictly_below(f"median TTFT at {poisson.rows[0].load}: continuous / static", ratio(p_cont.ttft_p50, p_static.ttft_p50), 1.0),
    ]


def feature_targets(paging, prefix, chunked, speculative) -> tuple[list[Target], list[Target]]:
    """(checks of correctness and counts, checked on every run; timing checks, full runs only)."""
    paged, reserved = paging.find(setup="paged"), paging.find(setup="reserved")
    small = paging.find(setup="paged, pool too small")
    off, on = prefix.find(setup="off"), prefix.find(setup="on")
    whole, chunk64 = chunked.find(setup="None (whole prompt)"), chunked.find(setup="64")
    exact = [
        Target.at_least("paging: greedy outputs equal the unconstrained engine's, every setup (1 = yes)",
                        float(all(r.identical == "yes" for r in paging.rows)), 1),
        Target.at_least("paging: preemptions in the too-small pool", small.preemptions, 1),
        Target.at_least("paging: most sequences running at once, paged / reserved", ratio(paged.max_running, reserved.max_running), 1.5, "x"),
        Target.at_least("prefix caching: outputs equal without it (1 = yes)", float(on.identical == "yes"), 1),
        Target.at_least("speculative: greedy output identical on every prompt (1 = yes)",
                        float(all(r.identical == "yes" for r in speculative.rows)), 1),
    ]
    timing = [  # a request finds the shared prefix cached only if it arrives after an earlier one computed it: timing
        Target.at_most("prefix caching: prefill tokens computed, on / off", ratio(on.prefill_tokens, off.prefill_tokens), 0.5),
        strictly_below("chunked prefill: streams' p99 ITL during a long prompt, chunk 64 / whole prompt",
                       ratio(chunk64.itl_p99, whole.itl_p99), 1.0),
        strictly_below("prefix caching: median TTFT, on / off", ratio(on.ttft_p50, off.ttft_p50), 1.0),
    ]
    return exact, timing


def run(quick: bool) -> BenchResult:
    setup = in_fresh_thread(load_setup)
    slo = SLOS.get(setup.device.type, SLOS["cpu"])
    prompts = chat_prompts(setup.tokenizer)
    decode = timed(lambda: batch1_decode(setup, quick))
    in_fresh_thread(lambda: warm_up(setup, prompts))

    # Saturation keeps the queue full for most of the run, as vLLM's method does by sending its whole data set at once:
    # three times the running batch, so that the last batch's ramp-down is not most of what is measured.
    count, budgets = (4, (8,)) if quick else (3 * MAX_BATCH, (16, 32, 64, 128))
    sizes = (1, 4) if quick else (1, 8, 16)
    saturated = timed(lambda: serving(setup, chat_workload(prompts, count, max_tokens=budgets), "all at once (saturation)",
                                      sizes, slo, "Serving at saturation: every request at t = 0"))
    # The open loop offers 60% of what continuous batching answered at saturation: within its capacity, not static's.
    rate = round(0.6 * saturated.find(system="kit engine, continuous").request_rate, 2)
    hf_best = max((r for r in saturated.rows if r.system.startswith("transformers")), key=lambda r: r.output_tps or 0)
    best_size = int(hf_best.system.rsplit("=", 1)[1])
    poisson = timed(lambda: serving(setup, chat_workload(prompts, count, rate, max_tokens=budgets), f"Poisson {rate:g} req/s",
                                    [best_size], slo, f"Serving under Poisson arrivals at {rate:g} req/s (seed 0)"))

    paging, prefix, chunked, speculative = feature_reports(setup, quick)
    exact, timing = feature_targets(paging, prefix, chunked, speculative)
    targets = full_runs_only(serving_targets(decode, saturated, poisson) + timing, quick) + exact
    return BenchResult("llm", [decode, saturated, poisson, paging, prefix, chunked, speculative], targets)
