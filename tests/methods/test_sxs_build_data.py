"""SxS data construction: Algorithm 1, oracles, the concurrent builder, resume, and the judge over HTTP."""

from __future__ import annotations

import json
import threading
import time

import pytest
import torch

from slime_ext.methods.sxs.builder import build
from slime_ext.methods.sxs.interleave import Block, interleave, normalise, render, repair, segment, visible_answer
from slime_ext.methods.sxs.oracles import JudgeOracle, OracleError, RuleOracle, parse_count
from slime_ext.methods.sxs.synthetic import triple_from_row

R = ["r1", "r2", "r3", "r4"]
A = ["a1", "a2", "a3"]


def test_normalise_and_segment():
    assert normalise("  a\r\n\r\n\n\nb\n \n c \n") == "a\n\nb\n\n c"  # indentation kept
    assert segment("a\n\n\n\nb\n\nc") == ["a", "b", "c"]


def test_interleave_hand_made_cases():
    # progressive unlocking; adjacent reasoning that unlocks nothing is merged
    assert interleave(R, A, [1, 1, 2, 3]) == [
        Block("think", "r1"), Block("speak", "a1"), Block("think", "r2\n\nr3"), Block("speak", "a2"),
        Block("think", "r4"), Block("speak", "a3")]
    # noisy non-monotone oracle: 2, then 1 (repaired to 2), then 3
    assert repair([2, 1, 0, 3], 3) == [2, 2, 2, 3]
    assert interleave(R, A, [2, 1, 0, 3]) == [
        Block("think", "r1"), Block("speak", "a1\n\na2"), Block("think", "r2\n\nr3\n\nr4"), Block("speak", "a3")]
    # early full coverage: the rest of the reasoning is one trailing think block
    assert interleave(R, A, [0, 3, 3, 3]) == [
        Block("think", "r1\n\nr2"), Block("speak", "a1\n\na2\n\na3"), Block("think", "r3\n\nr4")]
    # nothing unlocked until the end: the terminal safeguard gives the whole answer last
    assert interleave(R, A, [0, 0, 0, 0]) == [Block("think", "r1\n\nr2\n\nr3\n\nr4"), Block("speak", "a1\n\na2\n\na3")]
    tagged = render(interleave(R, A, [1, 1, 2, 3]))
    assert tagged.startswith("<think>r1</think><speak>a1</speak><think>r2")
    assert visible_answer(tagged) == "a1\n\na2\n\na3"
    with pytest.raises(ValueError, match="3 coverage counts for 4"):
        interleave(R, A, [1, 2, 3])


def test_rule_oracle_on_a_synthetic_triple():
    row = {"id": "x1", "prompt": "Ann has 5 pens. She buys 3. Then she loses 2. How many?", "label": "6",
           "solution": "Step 1: Ann buys 3, so 5 + 3 = 8.\nStep 2: She loses 2, so 8 - 2 = 6.\n\\boxed{6}"}
    t = triple_from_row(row)
    assert segment(t["reasoning"]) == ["Step 1: Ann buys 3, so 5 + 3 = 8.", "Step 2: She loses 2, so 8 - 2 = 6."]
    assert segment(t["answer"])[-1] == "So the answer is \\boxed{6}." and t["requires"] == [-1, 0, 1, 1]
    o = RuleOracle()
    blocks = segment(t["answer"])
    assert [o.coverage(t["question"], segment(t["reasoning"])[:k], blocks, 0, t) for k in (1, 2)] == [2, 4]
    with pytest.raises(OracleError, match="requires"):
        o.coverage("q", ["r"], ["a"], 0, {})


class CountingOracle:
    """Rule oracle with a call counter and a delay (so concurrent checks overlap)."""

    def __init__(self, delay: float = 0.02):
        self.rule, self.calls, self.delay, self.lock = RuleOracle(), 0, delay, threading.Lock()

    def coverage(self, question, reasoning, answer, shown, example=None):
        with self.lock:
            self.calls += 1
        time.sleep(self.delay)
        return self.rule.coverage(question, reasoning, answer, shown, example)


def _early(i: int, n_steps: int = 8) -> dict:
    return {"id": f"e{i}", "question": f"q{i}", "reasoning": "\n\n".join(f"step {k}" for k in range(n_steps)),
            "answer": "x\n\ny", "requires": [0, 1]}


def test_concurrent_builder_cancels_after_full_coverage_and_matches_sequential(tmp_path):
    examples = [_early(i) for i in range(5)]
    oracle = CountingOracle()
    report = build(examples, oracle, tmp_path / "out.jsonl", concurrency=2)
    assert report.examples == 5 and report.checks_sequential == 40
    assert report.checks_made == oracle.calls < report.checks_sequential and report.cancelled > 0
    rows = [json.loads(x) for x in (tmp_path / "out.jsonl").read_text().splitlines()]
    for ex, row in zip(examples, rows):  # the sequential construction: every prefix asked
        reasoning, answer = segment(ex["reasoning"]), segment(ex["answer"])
        seq = [RuleOracle().coverage(ex["question"], reasoning[: k + 1], answer, 0, ex) for k in range(len(reasoning))]
        assert row["text"] == render(interleave(reasoning, answer, seq))


def test_build_resumes_and_records_failures(tmp_path):
    out = tmp_path / "out.jsonl"
    examples = [_early(i, 3) for i in range(4)]
    build(examples[:2], RuleOracle(), out)
    with out.open("a") as f:
        f.write('{"id": "e2", "quest')  # a line cut by a crash
    bad = {"id": "bad", "question": "q", "reasoning": "r", "answer": "a"}  # no 'requires' for the rule oracle
    report = build(examples + [bad], RuleOracle(), out)
    assert report.skipped_done == 2 and report.examples == 2
    assert report.failures == [{"id": "bad", "error": "OracleError: the rule oracle needs 'requires' "
                                                     "(one reasoning-step index per answer block)"}]
    ids = [json.loads(x)["id"] for x in out.read_text().splitlines()]
    assert ids == ["e0", "e1", "e2", "e3"]  # the cut row was dropped and built again
    with pytest.raises(ValueError, match="example 0: missing 'answer'"):
        build([{"id": 1, "question": "q", "reasoning": "r"}], RuleOracle(), tmp_path / "x.jsonl")


def test_judge_reply_parsing_is_strict():
    assert parse_count(" 2 ", 3) == 2 and parse_count("0.", 3) == 0
    for bad in ("two", "2 blocks", "", "4"):
        with pytest.raises(OracleError):
            parse_count(bad, 3)


@pytest.fixture(scope="module")
def judge_server(tmp_path_factory):
    """The real embedded server with a tiny model trained to answer "1" to anything."""
    from transformers import AutoModelForCausalLM

    from slime_ext.engine.embedded import EmbeddedEngine
    from slime_ext.tools.serve import ServerState, serve
    from slime_ext.tokenizer import load_tokenizer, train_tokenizer
    from tests.megatron_fixtures import tiny_moe_config

    d = tmp_path_factory.mktemp("judge")
    tok = train_tokenizer(["Question: how many are covered? Reasoning so far: step 1 2 3 Answer: 1"] * 30,
                          vocab_size=300, out_dir=d)
    torch.manual_seed(0)
    torch.set_num_threads(1)
    # judge prompts run to ~500 tokens: the server now refuses prompts past the model's positions (issue 15)
    model = AutoModelForCausalLM.from_config(tiny_moe_config(vocab_size=len(tok), max_position_embeddings=2048))
    one, eos = tok("1")["input_ids"], tok.eos_token_id
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    g = torch.Generator().manual_seed(0)
    for _ in range(120):  # learn "<anything> -> 1 <eos>"
        prompts = torch.randint(5, len(tok), (8, 12), generator=g)
        ids = torch.cat([prompts, torch.tensor(one + [eos]).repeat(8, 1)], 1)
        logits = model(ids).logits[:, 11:-1]
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), ids[:, 12:].reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.save_pretrained(d)
    state = ServerState(EmbeddedEngine.from_pretrained(str(d)), load_tokenizer(d), "judge", max_tokens=4)
    srv = serve(state)
    yield f"http://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()
    state.batcher.close()


def test_judge_oracle_over_http_with_cache(judge_server, tmp_path):
    from slime_ext.clients.openai_client import OpenAIClient

    cache = tmp_path / "cache.jsonl"
    oracle = JudgeOracle(OpenAIClient(judge_server), cache_path=cache)
    assert oracle.coverage("q", ["step 1"], ["a", "b", "c"], 0) == 1
    assert oracle.coverage("q", ["step 1"], ["a", "b", "c"], 0) == 1 and oracle.calls == 1  # cached
    assert oracle.coverage("q", ["step 1"], ["a", "b", "c"], 1) == 2  # shown + the judge's count on pending
    again = JudgeOracle(OpenAIClient(judge_server), cache_path=cache)
    assert again.coverage("q", ["step 1"], ["a", "b", "c"], 0) == 1 and again.calls == 0  # from the file
    ex = {"id": "j", "question": "q", "reasoning": "r1\n\nr2\n\nr3", "answer": "a\n\nb"}
    report = build([ex], JudgeOracle(OpenAIClient(judge_server)), tmp_path / "j.jsonl", concurrency=3)
    assert report.examples == 1 and not report.failures


def test_cli_synthetic_rule(tmp_path, capsys):
    from slime_ext.methods.sxs.build_data import main

    out = tmp_path / "sxs.jsonl"
    assert main(["--synthetic", "6", "--out", str(out)]) == 0
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    assert len(rows) == 6 and all(r["text"].startswith("<think>Step 1") for r in rows)
    assert all("\\boxed{" + r["label"] + "}" in visible_answer(r["text"]) for r in rows)
    report = json.loads((tmp_path / "sxs.jsonl.report.json").read_text())
    assert report["examples"] == 6 and report["failures"] == []
    assert main(["--input", str(tmp_path / "missing.jsonl"), "--out", str(out)]) == 2


def test_interleaved_synthetic_rows_keep_the_answer_visible():
    from slime_ext.methods.sxs.interleave import interleave_row
    from slime_ext.tasks.synthetic_math import generate_dataset

    for row in generate_dataset(["L2"], 20, 0, "train"):
        out = interleave_row(row)
        assert out["cot_solution"] == row["solution"] and out["solution"].startswith("<think>Step 1")
        assert out["solution"].count("<think>") == out["solution"].count("</think>") >= 1
        assert "\\boxed{" + str(row["label"]) + "}" in visible_answer(out["solution"])
