"""slime_ext.tools.stream_timing: a checkpoint served by our server, prompts streamed one at a time, every delta's
arrival time recorded; the CLI on a run config's held-out prompts."""

from __future__ import annotations

import json

import pytest
import torch

from tests.conftest import CONFIGS


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    from transformers import AutoModelForCausalLM

    from slime_ext.tokenizer import train_tokenizer
    from tests.megatron_fixtures import tiny_moe_config

    d = tmp_path_factory.mktemp("m")
    tok = train_tokenizer(["Question: what is 1 + 2?\nAnswer: Step 1: 1 + 2 = 3.\n\\boxed{3}"] * 40, vocab_size=300,
                          out_dir=d)
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(tiny_moe_config(vocab_size=len(tok), initializer_range=0.3)).save_pretrained(d)
    return d


def test_timelines_are_ordered_reproducible_and_speak_only_reaches_the_server(model_dir, monkeypatch):
    from slime_ext.tools import stream_timing
    from slime_ext.tools.stream_timing import stream_timings

    rows = [{"id": "a", "prompt": "what is 1 + 2?", "level": "V2"}, {"id": "b", "prompt": "what is 2 + 2?"}]
    first = stream_timings(model_dir, rows, "plain", max_tokens=10, seed=3, progress=False)
    again = stream_timings(model_dir, rows, "plain", max_tokens=10, seed=3, progress=False)
    assert [r["prompt_id"] for r in first] == ["a", "b"] and first[0]["level"] == "V2"
    for r, s in zip(first, again):
        times = [t for t, _ in r["deltas"]]
        assert times == sorted(times) and r["deltas"][-1][1] == "" and r["total_s"] == times[-1] > 0
        assert r["first_delta_s"] is None or 0 < r["first_delta_s"] <= r["total_s"]
        assert "".join(t for _, t in r["deltas"]) == "".join(t for _, t in s["deltas"])  # seeded: the same text
    assert any(len(r["deltas"]) > 2 for r in first)  # streamed in pieces, not one block
    # speak_only sends the server's extension: the stream is the speak channel, without the tags (what it holds is
    # tests/serving/test_serve.py's check); the timeline is recorded the same way
    sent: list[dict] = []
    real = stream_timing.stream_one
    monkeypatch.setattr(stream_timing, "stream_one", lambda url, prompt, params: sent.append(params) or real(url, prompt, params))
    speak = stream_timings(model_dir, rows, "plain", max_tokens=10, seed=3, speak_only=True, progress=False)
    assert [p.get("speak_only") for p in sent] == [True] * 3 and [p["seed"] for p in sent] == [3, 3, 4]
    for r in speak:
        text = "".join(t for _, t in r["deltas"])
        assert not any(tag in text for tag in ("<think>", "</think>", "<speak>", "</speak>"))
        assert [t for t, _ in r["deltas"]] == sorted(t for t, _ in r["deltas"])


def test_the_cli_streams_a_run_configs_held_out_prompts(model_dir, tmp_path):
    from slime_ext.tools.stream_timing import main

    config = tmp_path / "run.yaml"
    config.write_text(f"extends: {CONFIGS / 'grpo.yaml'}\nrun:\n  cache_dir: {tmp_path / 'cache'}\n"
                      "data:\n  synthetic:\n    n_train: 20\n    n_eval: 5\n")
    out = tmp_path / "timing.jsonl"
    assert main([str(model_dir), "--config", str(config), "--prompts", "3", "--max-tokens", "6", "--out", str(out)]) == 0
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(records) == 3 and all(r["total_s"] > 0 for r in records)
