"""The OpenAI-compatible server for SmolLM2 (helpers/serving/llm_server.py), through the official ``openai`` client and
raw HTTP: greedy answers equal transformers' ``generate``, streaming equals not streaming, usage, stop strings, seeds,
errors that say what was wrong, a bounded queue, disconnects that free KV blocks, vLLM's metrics, loopback only,
SIGTERM that drains."""
from __future__ import annotations

import json
import signal
import time

import httpx
import psutil
import pytest
import torch
from prometheus_client.parser import text_string_to_metric_families

from helpers.serving import CompletionsSender, open_loop_test, read_metrics, start_llm_service
from helpers.serving.llm_server import DEFAULT_MAX_TOKENS, TextStream
from helpers.serving.smollm import MODEL_ID, load_tokenizer

CHATS = [  # different kinds: a factual question, a system prompt with an instruction, a multi-turn conversation
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "system", "content": "You are a concise assistant who answers in one sentence."},
     {"role": "user", "content": "Explain what a GPU is."}],
    [{"role": "user", "content": "Write a Python function that adds two numbers."},
     {"role": "assistant", "content": "def add(a, b):\n    return a + b"},
     {"role": "user", "content": "Now make it multiply them instead."}],
]
GREEDY_TOKENS = 20


def label(name: str, **labels: str) -> str:
    """A key of ``read_metrics``: the sample name and its labels, sorted, model_name included."""
    labels = {"model_name": MODEL_ID, **labels}
    return name + "{" + ",".join(f"{k}={v}" for k, v in sorted(labels.items())) + "}"


def wait_for_metric(url: str, name: str, value: float, seconds: float = 8.0) -> dict:
    deadline = time.monotonic() + seconds
    while True:
        metrics = read_metrics(url)
        if metrics.get(label(name)) == value or time.monotonic() > deadline:
            return metrics
        time.sleep(0.1)


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer()


@pytest.fixture(scope="module")
def server():
    with start_llm_service(max_batch=4, threads=1) as served:   # one torch thread: robust on a busy 2-core machine
        yield served


@pytest.fixture(scope="module")
def small_server():
    """One request at a time, one more may wait, a KV pool of 8 blocks (128 tokens)."""
    with start_llm_service(max_batch=1, max_waiting=1, num_blocks=8, threads=1) as served:
        yield served


@pytest.fixture(scope="module")
def client(server):
    from openai import OpenAI

    return OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def reference(smollm_reference):
    """transformers over the same GGUF file (tests/conftest.py): the model and tokenizer the server's greedy answers must
    match, run on one thread here."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)   # two threads beside a busy server and other work run many times slower on 2 cores
    yield smollm_reference
    torch.set_num_threads(threads)


def chat(client, messages, **options):
    """(text, finish_reason, usage) of one answer, streamed or not."""
    options = {"model": MODEL_ID, "messages": messages, **options}
    if not options.get("stream"):
        answer = client.chat.completions.create(**options)
        return answer.choices[0].message.content, answer.choices[0].finish_reason, answer.usage
    chunks = list(client.chat.completions.create(**options, stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert all(c.usage is None for c in chunks[:-1]) and chunks[-1].choices == []
    pieces = [c.choices[0].delta.content or "" for c in chunks[:-1]]
    assert not any("\ufffd" in p for p in pieces), "a streamed piece split a character"
    return "".join(pieces), chunks[-2].choices[0].finish_reason, chunks[-1].usage


# --- detokenization (no server) ------------------------------------------------------------------------------------
def test_streamed_text_never_splits_a_character_and_stops_before_a_stop_string(tokenizer):
    text = "Café ☕ costs 3€ — 日本語 🙂🙃 done. END here"
    ids = tokenizer.encode(text)
    assert len(ids) < len(text.encode()), "the sample should hold multi-byte characters spread over tokens"
    stream, pieces, broken = TextStream(tokenizer, []), [], 0
    for token in ids:
        stream.add(token)
        broken += tokenizer.decode(stream.tokens).endswith("\ufffd")
        pieces.append(stream.take())
    stream.finish()
    pieces.append(stream.take())
    assert broken > 0, "some prefix should end inside a character, or this test shows nothing"
    assert "".join(pieces) == text and not any("\ufffd" in p for p in pieces)

    answer = text[:text.index("END")]
    stream, sent = TextStream(tokenizer, ["END", "done!"]), ""
    for token in ids:
        stream.add(token)
        sent += stream.take()
        assert answer.startswith(sent), f"sent {sent!r}, which the stop string later cuts"
    stream.finish()
    sent += stream.take()
    assert stream.stopped and stream.final and sent == answer


# --- answers ---------------------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_models_names_the_served_model(client, server):
    assert [m.id for m in client.models.list()] == [MODEL_ID]
    card = httpx.get(server.url + "/v1/models").json()["data"][0]
    assert card["max_model_len"] == 8192 and httpx.get(server.url + "/health").json() == {"status": "ok"}


@pytest.mark.slow
def test_greedy_chat_equals_transformers_generate_streamed_or_not(client, reference):
    model, hf_tokenizer = reference
    for messages in CHATS:
        prompt = hf_tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        ids = hf_tokenizer(prompt, add_special_tokens=False, return_tensors="pt").input_ids
        with torch.no_grad():
            out = model.generate(ids, max_new_tokens=GREEDY_TOKENS, do_sample=False)[0, ids.shape[1]:]
        expected = hf_tokenizer.decode(out, skip_special_tokens=True)
        ended = int(out[-1]) == hf_tokenizer.eos_token_id
        for stream in (False, True):
            text, finish, usage = chat(client, messages, max_tokens=GREEDY_TOKENS, temperature=0, stream=stream)
            assert text == expected, f"stream={stream}: {text!r} != transformers' {expected!r}"
            assert finish == ("stop" if ended else "length")
            assert (usage.prompt_tokens, usage.completion_tokens) == (ids.shape[1], len(out))
            assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens


@pytest.mark.slow
def test_completions_streamed_equal_not_streamed_with_usage(client, tokenizer):
    prompt = "def fibonacci(n):\n"
    done = client.completions.create(model=MODEL_ID, prompt=prompt, max_tokens=16, temperature=0)
    chunks = list(client.completions.create(model=MODEL_ID, prompt=[prompt], max_tokens=16, temperature=0, stream=True,
                                            stream_options={"include_usage": True}))
    assert done.object == "text_completion" and done.choices[0].text
    assert "".join(c.choices[0].text for c in chunks[:-1]) == done.choices[0].text
    assert chunks[-2].choices[0].finish_reason == done.choices[0].finish_reason
    assert done.usage.prompt_tokens == len(tokenizer.encode(prompt)) == chunks[-1].usage.prompt_tokens
    assert done.usage.completion_tokens == chunks[-1].usage.completion_tokens <= 16
    again = client.completions.create(model=MODEL_ID, prompt=prompt * 3, max_tokens=1, temperature=0)
    again = client.completions.create(model=MODEL_ID, prompt=prompt * 3, max_tokens=1, temperature=0)
    assert again.usage.prompt_tokens_details.cached_tokens >= 16, "a repeated prompt reuses its cached blocks"


@pytest.mark.slow
def test_stop_strings_cut_the_answer_before_them(client):
    messages = CHATS[1]
    full, _, full_usage = chat(client, messages, max_tokens=GREEDY_TOKENS, temperature=0)
    words = full.split()
    assert len(words) > 4, f"the answer is too short to cut: {full!r}"
    stop = words[3]
    for stream in (False, True):
        text, finish, usage = chat(client, messages, max_tokens=GREEDY_TOKENS, temperature=0, stream=stream,
                                   stop=["never appears", stop])
        assert (text, finish) == (full[:full.index(stop)], "stop")
        assert usage.completion_tokens < full_usage.completion_tokens


@pytest.mark.slow
def test_a_seed_makes_sampling_reproducible(client):
    def sampled(seed, messages):
        return chat(client, messages, max_tokens=8, temperature=1.0, top_p=0.95, seed=seed)[0]

    for messages in CHATS[:2]:
        assert sampled(7, messages) == sampled(7, messages)
    assert any(sampled(7, m) != sampled(8, m) for m in CHATS), "different seeds gave the same text every time"


@pytest.mark.slow
def test_without_max_tokens_the_answer_is_bounded_by_the_default_and_the_pool(small_server, tokenizer):
    prompt = "1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25,"
    room = 128 - len(tokenizer.encode(prompt))          # the small server's pool: 8 blocks of 16 tokens
    assert 0 < room < DEFAULT_MAX_TOKENS
    answer = httpx.post(small_server.url + "/v1/completions", json={"prompt": prompt, "temperature": 0}, timeout=60)
    usage, choice = answer.json()["usage"], answer.json()["choices"][0]
    assert usage["completion_tokens"] == room and choice["finish_reason"] == "length", choice


# --- bad input -----------------------------------------------------------------------------------------------------
HI = [{"role": "user", "content": "Hi"}]
BAD = [  # (endpoint, body (bytes as is, else JSON), status, words the message must hold)
    ("chat", b"this is not json", 400, "not valid JSON"),
    ("chat", b'{"messages": [{"role": "user", "content": "caf\xe9"}]}', 400, "not valid UTF-8"),
    ("chat", b"[1, 2]", 400, "JSON object"),
    ("chat", {"model": MODEL_ID}, 400, "messages"),
    ("chat", {"messages": []}, 400, "messages is empty"),
    ("chat", {"messages": [{"role": "robot", "content": "Hi"}]}, 400, "role"),
    ("chat", {"messages": [{"role": "user", "content": 5}]}, 400, "content"),
    ("chat", {"messages": HI, "max_tokens": "8"}, 400, "max_tokens"),
    ("chat", {"messages": HI, "model": "gpt-4o"}, 404, "The model `gpt-4o` does not exist"),
    ("chat", {"messages": HI, "max_tokens": -1}, 400, "max_tokens must be between 1"),
    ("chat", {"messages": HI, "max_tokens": 0}, 400, "max_tokens must be between 1"),
    ("chat", {"messages": HI, "max_tokens": 10 ** 9}, 400, "max_tokens must be between 1"),
    ("chat", {"messages": HI, "max_tokens": 8180}, 400, "context of 8192"),
    ("chat", {"messages": [{"role": "user", "content": "hello " * 9000}]}, 400, "longer than the model's context"),
    ("chat", {"messages": HI, "temperature": 2.5}, 400, "temperature must be between 0 and 2"),
    ("chat", {"messages": HI, "top_p": 0}, 400, "top_p must be in (0, 1]"),
    ("chat", {"messages": HI, "n": 2}, 400, "n must be 1"),
    ("chat", {"messages": HI, "stop": ["a", "b", "c", "d", "e"]}, 400, "up to 4"),
    ("chat", b'{"messages": [{"role": "user", "content": "\\ud800"}]}', 400, "not valid Unicode"),
    ("completions", {"prompt": ["one", "two"]}, 400, "one prompt per request"),
    ("completions", {"prompt": ""}, 400, "prompt is empty"),
    ("completions", {"prompt": [10 ** 6]}, 400, "prompt tokens must be in"),
]


@pytest.mark.slow
@pytest.mark.parametrize("endpoint, body, status, words", BAD, ids=[f"{b[0]}-{i}" for i, b in enumerate(BAD)])
def test_bad_input_gets_a_4xx_that_says_what_was_wrong(server, endpoint, body, status, words):
    url = f"{server.url}/v1/{'chat/completions' if endpoint == 'chat' else 'completions'}"
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    answer = httpx.post(url, content=content, headers={"content-type": "application/json"}, timeout=60)
    error = answer.json()["error"]
    assert answer.status_code == status and words in error["message"], error
    assert set(error) == {"message", "type", "param", "code"}
    assert httpx.get(server.url + "/health").status_code == 200


@pytest.mark.slow
def test_the_openai_client_sees_its_own_error_types_and_the_server_stays_up(client, server):
    import openai

    with pytest.raises(openai.NotFoundError, match="does not exist"):
        client.chat.completions.create(model="nope", messages=HI, max_tokens=2)
    with pytest.raises(openai.BadRequestError, match="max_tokens"):
        client.chat.completions.create(model=MODEL_ID, messages=HI, max_tokens=-5)
    assert httpx.post(server.url + "/v1/nowhere", json={}).status_code == 404
    assert chat(client, HI, max_tokens=2, temperature=0)[2].completion_tokens >= 1


@pytest.mark.slow
def test_a_prompt_longer_than_the_kv_pool_is_refused(small_server):
    answer = httpx.post(small_server.url + "/v1/completions", json={"prompt": "word " * 200, "max_tokens": 4})
    assert answer.status_code == 400 and "KV cache holds (128 tokens)" in answer.json()["error"]["message"]


# --- load, disconnects, metrics --------------------------------------------------------------------------------------
@pytest.mark.slow
def test_a_full_queue_answers_429_with_retry_after(small_server):
    url = small_server.url
    body = {"prompt": "Once upon a time", "max_tokens": 100, "temperature": 0, "stream": True}
    with httpx.Client(timeout=60) as first, httpx.Client(timeout=60) as second:
        with first.stream("POST", url + "/v1/completions", json=body) as running:
            lines = running.iter_lines()   # kept: dropping the iterator would close the connection
            next(lines)                    # the first token: it runs, alone (max batch 1)
            with second.stream("POST", url + "/v1/completions", json=body) as waiting:
                assert waiting.status_code == 200
                assert wait_for_metric(url, "vllm:num_requests_waiting", 1)[label("vllm:num_requests_waiting")] == 1
                refused = httpx.post(url + "/v1/completions", json={**body, "stream": False})
                assert refused.status_code == 429 and int(refused.headers["Retry-After"]) >= 1
                assert "--max-waiting 1" in refused.json()["error"]["message"]
    metrics = wait_for_metric(url, "vllm:num_requests_running", 0)
    assert metrics[label("vllm:kv_cache_usage_perc")] == 0
    assert httpx.post(url + "/v1/completions", json={"prompt": "Hi", "max_tokens": 2}, timeout=60).status_code == 200


@pytest.mark.slow
@pytest.mark.parametrize("stream", [True, False])
def test_a_client_that_disconnects_frees_its_blocks(server, stream):
    url, aborted = server.url, label("vllm:request_success_total", finished_reason="abort")
    before = read_metrics(url)[aborted]
    counting = "1, 2, 3, 4, 5, 6, 7, 8, 9, 10,"   # greedy decoding goes on counting: no end of sequence soon
    body = {"model": MODEL_ID, "prompt": counting, "max_tokens": 2000, "temperature": 0, "stream": stream}
    if stream:
        with httpx.stream("POST", url + "/v1/completions", json=body, timeout=60) as answer:
            lines = answer.iter_lines()
            for _ in range(4):
                next(lines)
            assert read_metrics(url)[label("vllm:kv_cache_usage_perc")] > 0
    else:
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(url + "/v1/completions", json=body, timeout=httpx.Timeout(60, read=2.0))
    metrics = wait_for_metric(url, "vllm:kv_cache_usage_perc", 0)
    assert metrics[label("vllm:kv_cache_usage_perc")] == 0 and metrics[label("vllm:num_requests_running")] == 0
    assert metrics[aborted] == before + 1


@pytest.mark.slow
def test_metrics_carry_vllms_names_and_count_what_was_sent(client, server):
    text = httpx.get(server.url + "/metrics").text
    families = {f.name: f for f in text_string_to_metric_families(text)}
    for name in ("num_requests_running", "num_requests_waiting", "kv_cache_usage_perc", "time_to_first_token_seconds",
                 "time_per_output_token_seconds", "inter_token_latency_seconds", "e2e_request_latency_seconds"):
        assert f"vllm:{name}" in families
    for name in ("prompt_tokens", "generation_tokens", "request_success", "num_preemptions", "prefix_cache_queries",
                 "prefix_cache_hits", "spec_decode_num_draft_tokens", "spec_decode_num_accepted_tokens"):
        assert families[f"vllm:{name}"].type == "counter" and f"vllm:{name}_total{{" in text
    assert "_total_total" not in text and "_created" not in text
    assert all(s.labels.get("model_name") == MODEL_ID for f in families.values() for s in f.samples)

    before = read_metrics(server.url)
    usages = [chat(client, CHATS[0], max_tokens=6, temperature=0, stream=s)[2] for s in (False, True)]
    after = read_metrics(server.url)

    def grew(name, **labels):
        return after[label(name, **labels)] - before[label(name, **labels)]

    assert grew("vllm:prompt_tokens_total") == sum(u.prompt_tokens for u in usages)
    assert grew("vllm:generation_tokens_total") == sum(u.completion_tokens for u in usages)
    assert grew("vllm:request_success_total", finished_reason="stop") + grew("vllm:request_success_total",
                                                                             finished_reason="length") == 2
    assert grew("vllm:prefix_cache_hits_total") >= usages[0].prompt_tokens // 16 * 16 - 16   # the second reused it
    for histogram in ("time_to_first_token_seconds", "e2e_request_latency_seconds", "time_per_output_token_seconds"):
        assert grew(f"vllm:{histogram}_count") == 2
    assert grew("vllm:inter_token_latency_seconds_count") == sum(u.completion_tokens - 1 for u in usages)
    assert 0 < grew("vllm:time_to_first_token_seconds_sum") <= grew("vllm:e2e_request_latency_seconds_sum")


@pytest.mark.slow
def test_the_load_test_client_counts_tokens(server):
    report = open_loop_test(CompletionsSender(server.url, ["The sky is", "def main():"], max_tokens=[4, 6]), rate=4.0,
                            max_requests=3, max_seconds=2.0)
    row = report.rows[0]
    assert row.errors == 0 and sorted(r.output_tokens for r in row.records) == [4, 4, 6]


@pytest.mark.slow
def test_it_listens_on_loopback_only(server):
    listening = [c for c in psutil.Process(server.pid).net_connections(kind="inet") if c.status == psutil.CONN_LISTEN]
    assert listening and all(c.laddr.ip == "127.0.0.1" for c in listening)


# --- stopping --------------------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_sigterm_drains_requests_in_flight_then_exits_cleanly(small_server):
    url = small_server.url
    body = {"prompt": "The history of the printing press", "max_tokens": 48, "temperature": 0}
    expected = httpx.post(url + "/v1/completions", json=body, timeout=60).json()
    pieces, finish = [], None
    with httpx.stream("POST", url + "/v1/completions", json={**body, "stream": True}, timeout=60) as answer:
        lines = (line for line in answer.iter_lines() if line)
        pieces.append(json.loads(next(lines)[6:])["choices"][0]["text"])
        small_server.process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 5
        while httpx.get(url + "/health").status_code == 200 and time.monotonic() < deadline:
            time.sleep(0.05)
        refused = httpx.post(url + "/v1/completions", json=body)
        assert refused.status_code == 503 and "shutting down" in refused.json()["error"]["message"]
        for line in lines:
            if line == "data: [DONE]":
                break
            choice = json.loads(line[6:])["choices"][0]
            pieces.append(choice["text"])
            finish = choice["finish_reason"] or finish
    assert "".join(pieces) == expected["choices"][0]["text"] and finish == expected["choices"][0]["finish_reason"]
    assert small_server.process.wait(timeout=20) == 0
    assert "server stopped" in small_server.log_tail()


def test_the_server_builds_its_engine_off_the_main_thread(monkeypatch):
    """A parallel region on the main thread would leave an OpenMP team there for good, and the engine's own thread then
    decoded at half speed on 2 cores (helpers.core.load.in_fresh_thread); main() builds off the main thread."""
    import threading

    import prometheus_client

    from helpers.serving import llm_server

    class Built(Exception):
        """Stops main() once it has built the engine, before it serves."""

    seen = []

    def build_engine(args, device):
        seen.append(threading.current_thread() is threading.main_thread())
        raise Built

    monkeypatch.setattr(llm_server, "build_engine", build_engine)
    monkeypatch.setattr(prometheus_client, "disable_created_metrics", lambda: None)
    with pytest.raises(Built):
        llm_server.main(["--device", "cpu"])
    assert seen == [False]
