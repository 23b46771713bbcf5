"""SmolLM2 as the kit runs it: the same tokens and logits as transformers on the same file, a cache that loads fast
and rebuilds itself, and errors that name a missing, truncated or corrupt model file and the command that restores it."""
from __future__ import annotations

import shutil

import pytest
import torch

from helpers.core.paths import MODEL_CACHE_ENV
from helpers.serving import smollm
from helpers.serving.llama import Batch, load_llm
from helpers.serving.llm_engine import Engine

CHATS = [
    "What is a GPU?", "Write a haiku about memory bandwidth.", "List three prime numbers greater than 100.",
    "Explain what a KV cache is in one sentence.", "What is 17 times 23?", "Translate 'good morning' into French.",
    "Give me a Python function that reverses a string.", "Why is the sky blue?", "Name the planets of the solar system.",
    "What does HTTP stand for?", "Summarise the plot of Romeo and Juliet in two sentences.",
    "How do I make a cup of tea?", "What is the capital of Australia?", "Écris une phrase en français sur la pluie.",
    "Count from 1 to 10 in words.",
]
TEXTS = [  # plain continuations, no chat template
    "def fibonacci(n):\n    ", "The quick brown fox", "import torch\nimport torch.nn as nn\n\nclass",
    "Once upon a time, in a land far away,", "SELECT name, price FROM",
]
NEW_TOKENS = 64


@pytest.fixture(scope="module")
def model():
    return load_llm()


@pytest.fixture(scope="module")
def tokenizer():
    return smollm.load_tokenizer()


@pytest.fixture(scope="module")
def reference(smollm_reference):
    """transformers on the same GGUF file (tests/conftest.py): the reference the kit's code is checked against."""
    return smollm_reference


def reference_tokenizer_for(path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)


def _prompts(tokenizer):
    return [tokenizer.encode_chat([{"role": "user", "content": q}]) for q in CHATS] + [tokenizer.encode(t) for t in TEXTS]


@pytest.mark.slow  # transformers loads the model too (about 15 s), then 20 forward passes
def test_greedy_tokens_and_logits_equal_transformers_on_twenty_prompts(model, tokenizer, reference):
    """The engine's greedy tokens (64 each, end of sequence not stopping them) are transformers' argmax at every
    position of the same text, and the kit's logits are within 1e-4 of transformers' everywhere (fp32, CPU)."""
    hf, hf_tokenizer = reference
    prompts = _prompts(tokenizer)
    assert len(prompts) >= 20
    for question, ids in zip(CHATS, prompts):
        expected = hf_tokenizer.apply_chat_template([{"role": "user", "content": question}], add_generation_prompt=True)
        expected = expected["input_ids"] if isinstance(expected, dict) or hasattr(expected, "keys") else expected
        assert ids == list(expected), question  # tokenizer and chat template from the file, as transformers reads them
    outputs = Engine(model, max_batch=len(prompts), eos_ids=()).generate(prompts, NEW_TOKENS)
    worst = 0.0
    for ids, output in zip(prompts, outputs):
        text = torch.tensor([ids + output])
        with torch.no_grad():
            theirs = hf(text).logits[0, len(ids) - 1:-1]                          # (64, vocab): after each prefix
        cache = torch.zeros(2, model.config.layers, 16 * 16, model.config.kv_heads, model.config.head_dim)
        batch = Batch.build([(list(range(16)), 0, ids + output)], 16, all_logits=[0])
        ours = model(batch, cache[0], cache[1])[len(ids) - 1:-1]
        assert theirs.argmax(-1).tolist() == output, tokenizer.decode(ids)
        worst = max(worst, (ours - theirs).abs().max().item())
    assert worst < 1e-4, worst


@pytest.mark.slow
def test_transformers_generate_answers_what_the_engine_answers(model, tokenizer, reference):
    hf, hf_tokenizer = reference
    for question in CHATS[:3]:
        ids = tokenizer.encode_chat([{"role": "user", "content": question}])
        with torch.no_grad():
            theirs = hf.generate(torch.tensor([ids]), max_new_tokens=24, do_sample=False)[0, len(ids):].tolist()
        ours = Engine(model).generate([ids], 24)[0]
        assert ours == theirs
        assert tokenizer.decode(ours) == hf_tokenizer.decode(theirs, skip_special_tokens=True)


def test_the_tokenizer_reads_text_as_transformers_does(tokenizer):
    hf_tokenizer = reference_tokenizer_for(smollm.gguf_path())
    for text in ["x = 12345 + 678", "  indented\n\ttab  two  spaces", "héllo wörld 日本語 🙂", "don't I'll we've",
                 "<|im_start|>user\nhi<|im_end|>", "   ", "a\r\nb"]:
        ids = tokenizer.encode(text)
        assert ids == hf_tokenizer.encode(text, add_special_tokens=False), text
        assert tokenizer.decode(ids, skip_special_tokens=False) == text


def test_a_damaged_cache_is_rebuilt_equal_to_a_good_one(tmp_path, monkeypatch):
    tensors, config, cache = smollm.cached_weights()                  # the cache every LLM test reads (built once)
    assert config.kv_heads == 3 and config.heads == 9
    monkeypatch.setenv("EDL_BUILD_DIR", str(tmp_path))
    monkeypatch.delenv(MODEL_CACHE_ENV, raising=False)
    damaged = tmp_path / "models" / cache.name
    damaged.parent.mkdir(parents=True)
    damaged.write_bytes(cache.read_bytes()[:1000])                    # an interrupted copy
    again, _, rebuilt = smollm.cached_weights()
    assert rebuilt == damaged and rebuilt.stat().st_size == cache.stat().st_size
    assert all(torch.equal(again[name], tensors[name]) for name in ("embed.weight", "layers.29.mlp.down.weight"))


def test_a_truncated_or_corrupt_model_file_is_named_with_the_command_that_restores_it(tmp_path):
    source = smollm.gguf_path()
    truncated = tmp_path / source.name
    with source.open("rb") as f:
        truncated.write_bytes(f.read(1 << 20))
    with pytest.raises(smollm.ModelFileError, match="truncated") as error:
        smollm.verify(truncated)
    assert str(truncated) in str(error.value) and "make setup" in str(error.value)
    corrupt = tmp_path / "corrupt" / source.name
    corrupt.parent.mkdir()
    shutil.copy(source, corrupt)
    with corrupt.open("r+b") as f:
        f.seek(50_000_000)
        byte = f.read(1)
        f.seek(50_000_000)
        f.write(bytes([byte[0] ^ 0xFF]))
    with pytest.raises(smollm.ModelFileError, match="corrupt") as error:
        smollm.verify(corrupt)
    assert str(corrupt) in str(error.value) and smollm.PACKAGE in str(error.value)


def test_a_missing_model_package_says_how_to_install_it(monkeypatch):
    monkeypatch.setattr(smollm.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(smollm.ModelFileError, match="not installed") as error:
        smollm.gguf_path()
    assert "make setup" in str(error.value) and "--no-deps" in str(error.value)


@pytest.mark.slow  # writes the bf16 cache (about 10 s the first time)
def test_the_gpu_dtype_loads_and_agrees_with_fp32(model, tokenizer):
    """A GPU runs bf16 weights: the same code in bf16 (here on the CPU) picks the fp32 model's next token."""
    half = load_llm(dtype=torch.bfloat16)
    assert half.embed.weight.dtype == torch.bfloat16
    ids = tokenizer.encode_chat([{"role": "user", "content": "What is a GPU?"}])
    assert Engine(half).generate([ids], 4)[0][:2] == Engine(model).generate([ids], 4)[0][:2]


def test_a_shared_read_only_cache_is_read_first_and_a_stale_one_is_passed_over(tmp_path, monkeypatch):
    """How a grading sandbox loads the model: EDL_MODEL_CACHE names a folder of caches made by the kit elsewhere."""
    from helpers.core.paths import MODEL_CACHE_ENV
    from helpers.serving.smollm import cached_weights, ensure_cache

    made = ensure_cache()
    assert made.stat().st_mode & 0o004, "the cache must be readable by a sandbox's user"
    (tmp_path / made.name).symlink_to(made)
    monkeypatch.setenv(MODEL_CACHE_ENV, str(tmp_path))
    assert cached_weights()[2] == tmp_path / made.name
    (tmp_path / made.name).unlink()
    (tmp_path / made.name).write_bytes(b"not a safetensors file")
    assert cached_weights()[2] == made
