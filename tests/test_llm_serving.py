"""The language-model engine and server: cached decoding equals the model, batching never changes a greedy answer,
speculative decoding keeps the target's output, the OpenAI-compatible contract, its metrics, its errors, clean stops."""
from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

import httpx
import psutil
import pytest
import torch

from helpers.core.procs import free_port
from helpers.serving import (
    CompletionsSender,
    Engine,
    PagedKVCache,
    decode_tokens,
    encode_text,
    language_model,
    open_loop_test,
    read_metrics,
    resolve,
    speculative_decode,
    start_llm_service,
    target_only,
)
from helpers.serving.lm import CACHE_VERSION, ENV_TRAIN_SECONDS, code_only, learning_rate, model_path, sinusoids

PROMPTS = ["def ", "import os\n", "class Parser:\n    def __init__(self", "    return ", "for i in range(", "# "]


@pytest.fixture(scope="module")
def target():
    torch.manual_seed(0)
    model, info = language_model("target", "cpu")
    return model


@pytest.fixture(scope="module")
def service():
    with start_llm_service(max_batch=8, device="cpu", torch_threads=1) as served:
        yield served


def test_the_model_is_trained_on_the_standard_library_and_cached(target):
    again, info = language_model("target", "cpu")
    assert "standard library" in info.corpus and info.steps > 0 and info.parameters == sum(p.numel() for p in target.parameters())
    assert info.perplexity < 256  # better than a uniform guess over bytes
    assert all(torch.equal(a, b) for a, b in zip(again.state_dict().values(), target.state_dict().values()))


def test_the_corpus_keeps_code_and_drops_docstrings_comments_and_blank_lines():
    source = 'class A:\n    """Doc\n    string."""\n\n    # a note\n    def f(self):\n        \'\'\'Doc.\'\'\'\n        return "x"  # kept\n'
    assert code_only(source) == 'class A:\n    def f(self):\n        return "x"  # kept\n'
    assert code_only("def broken(:\n") == ""   # a file this Python cannot parse is left out


def test_training_warms_up_then_anneals_and_the_cache_is_versioned():
    rates = [learning_rate(1.0, p) for p in (0.0, 0.05, 0.5, 0.999)]
    assert rates[0] < 0.05 < rates[3] < 0.06 and rates[1] == pytest.approx(1.0) and rates[2] < rates[1]
    table = sinusoids(256, 64)
    assert table.shape == (256, 64) and torch.allclose(table[0, 1::2], torch.ones(32))   # cos(0) = 1


def test_a_time_cap_override_is_cached_apart_and_a_bad_one_is_a_clear_error(monkeypatch):
    monkeypatch.delenv(ENV_TRAIN_SECONDS, raising=False)
    assert model_path("target", "cpu").name == f"target-cpu-v{CACHE_VERSION}.pt"
    monkeypatch.setenv(ENV_TRAIN_SECONDS, "12.5")
    assert model_path("draft", "cpu").name == f"draft-cpu-v{CACHE_VERSION}-12.5s.pt"
    for bad in ("ten", "0", "-3"):
        monkeypatch.setenv(ENV_TRAIN_SECONDS, bad)
        with pytest.raises(ValueError, match=f"{ENV_TRAIN_SECONDS} must be a positive number of seconds, got '{bad}'"):
            model_path("target", "cpu")


def test_paged_decoding_equals_the_model_run_on_the_whole_sequence(target):
    prompt = encode_text(PROMPTS[2])
    out = Engine(target, block_size=4).generate([prompt], 24)[0]   # small blocks: the sequence spans many
    with torch.no_grad():
        logits = target(torch.tensor([prompt + out]))[0]
    assert out == logits[len(prompt) - 1:-1].argmax(-1).tolist()
    # and the cached logits equal the uncached ones at every position, not only their argmax
    engine = Engine(target, block_size=4)
    request = engine.add(prompt, 8)
    seen = []
    from helpers.serving import decode_step, prefill
    seen.append(prefill(target, engine.cache, request.id, torch.tensor(prompt)))
    tokens = prompt + [int(seen[0].argmax())]
    for _ in range(5):
        row = decode_step(target, engine.cache, [request.id], torch.tensor([tokens[-1]]), torch.tensor([len(tokens) - 1]))[0]
        seen.append(row)
        tokens.append(int(row.argmax()))
    with torch.no_grad():
        full = target(torch.tensor([tokens]))[0, len(prompt) - 1:-1]
    torch.testing.assert_close(torch.stack(seen), full, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("scheduler", ["continuous", "static"])
def test_a_greedy_answer_is_the_same_alone_or_in_a_busy_batch(target, scheduler):
    prompts = [encode_text(p) for p in PROMPTS]
    budgets = [12, 5, 16, 8, 12, 6]
    alone = [Engine(target).generate([p], m)[0] for p, m in zip(prompts, budgets)]
    together = Engine(target, scheduler, max_batch=4, block_size=8).generate(prompts, budgets)
    assert together == alone


def test_continuous_batching_admits_at_the_next_step_and_static_waits_for_the_batch(target):
    first_tokens = {}
    for scheduler in ("continuous", "static"):
        engine = Engine(target, scheduler, max_batch=4)
        long = engine.add(encode_text("def "), 12)
        engine.step()
        engine.step()
        late = engine.add(encode_text("x = "), 3)
        engine.step()
        first_tokens[scheduler] = (late.first_token_at is not None, long.done)
        while engine.has_work():
            engine.step()
        assert late.first_token_at > long.first_token_at
    assert first_tokens["continuous"] == (True, False)   # joined the running batch at once
    assert first_tokens["static"] == (False, False)      # waits while the batch runs


def test_kv_bytes_per_token_follow_the_formula_and_equal_what_is_allocated(target):
    layers, heads = len(target.blocks), target.blocks[0].n_heads
    head_dim = target.tok.embedding_dim // heads
    cache = PagedKVCache.for_model(target, num_blocks=10, block_size=16)
    assert cache.bytes_per_token == 2 * layers * heads * head_dim * 4            # fp32
    assert cache.allocated_bytes == cache.bytes_per_token * 10 * 16
    half = PagedKVCache(layers, heads, head_dim, 10, 16, dtype=torch.float16)
    assert half.allocated_bytes == half.bytes_per_token * 160 == cache.allocated_bytes // 2


def test_kv_memory_limits_admission_and_blocks_come_back(target):
    engine = Engine(target, max_batch=8, num_blocks=4, block_size=8)   # room for 2 requests of 16 tokens
    requests = [engine.add(encode_text("def f"), 10) for _ in range(5)]
    engine.step()
    assert len(engine.running) == 2 and len(engine.waiting) == 3
    while engine.has_work():
        engine.step()
    assert all(r.done for r in requests) and len(engine.cache.free_blocks) == 4 and engine.reserved == 0
    with pytest.raises(ValueError, match="context"):
        engine.add(encode_text("x" * 250), 10)


def test_speculative_greedy_output_is_the_targets(target):
    draft, _ = language_model("draft", "cpu")
    prompt = encode_text(PROMPTS[2])
    alone = target_only(target, prompt, 24)
    fast = speculative_decode(target, draft, prompt, 24, k=4)
    assert fast.tokens == alone.tokens
    assert fast.target_calls < alone.target_calls and 0 < fast.acceptance_rate <= 1


def test_the_acceptance_rule_samples_from_the_target_distribution():
    g = torch.Generator().manual_seed(0)
    p = torch.softmax(torch.randn(64, generator=g) * 2, 0)
    q = torch.softmax(torch.randn(64, generator=g) * 2, 0)
    n = 100_000
    proposed = torch.multinomial(q, n, replacement=True, generator=g)
    accepted, tokens = resolve(p, q, proposed, torch.rand(n, generator=g), g)
    seen = torch.bincount(tokens, minlength=64).float() / n
    assert 0.5 * (seen - p).abs().sum() < 0.02 < 0.5 * (q - p).abs().sum()   # the target's p, not the draft's q
    assert abs(accepted.float().mean() - torch.minimum(p, q).sum()) < 0.01   # acceptance = sum min(p, q)


def test_completions_models_health_and_streaming(service, target):
    models = httpx.get(service.url + "/v1/models").json()
    assert models["data"][0]["id"] and httpx.get(service.url + "/health").status_code == 200
    answer = httpx.post(service.url + "/v1/completions", json={"prompt": "def ", "max_tokens": 12, "temperature": 0}, timeout=60)
    assert answer.status_code == 200
    body = answer.json()
    expected = Engine(target).generate([encode_text("def ")], 12)[0]
    assert body["choices"][0]["text"] == decode_tokens(expected) and body["usage"]["completion_tokens"] == 12
    with httpx.stream("POST", service.url + "/v1/completions", timeout=60,
                      json={"prompt": "def ", "max_tokens": 12, "temperature": 0, "stream": True}) as streamed:
        lines = [line for line in streamed.iter_lines() if line]
    assert lines[-1] == "data: [DONE]"
    chunks = [json.loads(line[6:]) for line in lines[:-1]]
    assert "".join(c["choices"][0]["text"] for c in chunks) == body["choices"][0]["text"]
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"


def test_the_official_openai_client_works(service):
    from openai import OpenAI

    client = OpenAI(base_url=service.url + "/v1", api_key="unused")
    assert [m.id for m in client.models.list()]
    done = client.completions.create(model="any", prompt="import ", max_tokens=8, temperature=0)
    assert done.usage.completion_tokens == 8 and done.choices[0].text
    pieces = [c.choices[0].text for c in client.completions.create(model="any", prompt="import ", max_tokens=8,
                                                                      temperature=0, stream=True)]
    assert "".join(pieces) == done.choices[0].text


@pytest.mark.parametrize("body, status, words", [
    ("not json", 422, "invalid request"),
    ({"max_tokens": 4}, 422, "prompt"),
    ({"prompt": "def ", "max_tokens": 0}, 422, "max_tokens"),
    ({"prompt": "x" * 300, "max_tokens": 4}, 400, "context"),
    ({"prompt": "", "max_tokens": 4}, 400, "empty"),
    ({"prompt": ["a", "b"], "max_tokens": 4}, 400, "one prompt"),
])
def test_bad_requests_get_a_message_and_the_server_stays_up(service, body, status, words):
    sent = (httpx.post(service.url + "/v1/completions", content=body, headers={"content-type": "application/json"})
            if isinstance(body, str) else httpx.post(service.url + "/v1/completions", json=body))
    assert sent.status_code == status and words in sent.json()["error"]["message"]
    assert httpx.get(service.url + "/health").status_code == 200


def test_metrics_count_tokens_and_time_them_under_open_loop_load(service):
    before = read_metrics(service.url).get("llm:generation_tokens_total", 0.0)
    report = open_loop_test(CompletionsSender(service.url, PROMPTS, max_tokens=[8, 16]), rate=8.0, max_requests=12,
                            max_seconds=3.0)
    row = report.rows[0]
    assert row.errors == 0 and row.ttft_p50 is not None and row.output_tps > 0
    after = read_metrics(service.url)
    sent = sum(r.output_tokens for r in row.records)
    assert after["llm:generation_tokens_total"] - before == sent
    assert after["llm:time_to_first_token_seconds_count"] >= len(row.records)
    assert "llm:num_requests_running" in after and "llm:num_requests_waiting" in after
    assert after["llm:time_per_output_token_seconds_count"] >= len(row.records)


@pytest.mark.slow  # starts real processes: not in the unit lane
@pytest.mark.parametrize("how", [signal.SIGINT, signal.SIGTERM])
def test_ctrl_c_and_sigterm_stop_the_server_with_nothing_left(target, how):
    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "helpers.serving.llm_server", "--port", str(port), "--device", "cpu",
                               "--torch-threads", "1"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.2)
        else:
            pytest.fail("the server never became healthy")
        children = psutil.Process(server.pid).children(recursive=True)
        server.send_signal(how)
        output, _ = server.communicate(timeout=30)
    finally:
        if server.poll() is None:
            server.kill()
    assert server.returncode == 0 and "server stopped" in output
    assert not any(c.is_running() and c.status() != psutil.STATUS_ZOMBIE for c in children)
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"http://127.0.0.1:{port}/health", timeout=2)
