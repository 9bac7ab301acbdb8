"""THE token-exactness test: multi-turn episodes on the real embedded engine (a tiny random MoE, a tokenizer
trained here) with a scripted environment. Every trained token (loss mask 1) is the engine's sampled token at
that position with the engine's logprob, bit for bit; observation tokens carry mask 0 and logprob 0 and are
the observation text tokenised once; each turn's request was exactly prompt + everything before it; the
trainer's batch holds every value on its token; and a loop that re-tokenised the context from text would fail
the same check (shown on this tokenizer and these episodes)."""

from __future__ import annotations

import pytest
import torch

from sglang_patches.decoding import SamplingParams
from slime_ext.data import Sample
from slime_ext.data.batch import build_batch
from slime_ext.data.generation import GenerateRequest
from slime_ext.envs.rollout import EpisodeLimits, observation_ids, run_episodes
from tests.envs.conftest import RecordingEngine, ScriptedEnv, embedded_engine

PROMPTS = ["Question: what is 12 + 34?\nAnswer:", "<tool>python</tool><input>", "the cat sat"]


def episode_requests(tokenizer, n: int = 2, max_new: int = 10, routed: bool = False) -> list[GenerateRequest]:
    sp = SamplingParams(temperature=1.0, max_new_tokens=max_new)
    out = []
    for p, text in enumerate(PROMPTS):
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        out += [GenerateRequest(f"e{p}-{k}", ids, sp, seed=100 * p + k, return_routed_experts=routed) for k in range(n)]
    return out


def check_token_exact(prompt_ids, response_ids, loss_mask, logprobs, episode, calls, tokenizer, observations):
    """Raises AssertionError unless every generated token and logprob is the engine's and every observation
    is its text tokenised once, and each turn's input was exactly the episode's ids before it."""
    pos = 0
    for k, turn in enumerate(episode.turns):
        request, result = calls[turn.rid]
        assert request.input_ids == list(prompt_ids) + list(response_ids[:pos]), f"turn {k}: input is not the exact ids"
        n = len(result.output_ids)
        assert response_ids[pos:pos + n] == result.output_ids, f"turn {k}: trained tokens differ from the sampled"
        assert logprobs[pos:pos + n] == result.logprobs, f"turn {k}: logprobs differ from the engine's"
        assert loss_mask[pos:pos + n] == [1.0] * n
        pos += n
        obs = observation_ids(tokenizer, observations[k]) if turn.observation else []
        assert turn.observation == len(obs)
        assert response_ids[pos:pos + len(obs)] == obs, f"turn {k}: observation is not its text tokenised once"
        assert loss_mask[pos:pos + len(obs)] == [0.0] * len(obs) and logprobs[pos:pos + len(obs)] == [0.0] * len(obs)
        pos += len(obs)
    assert pos == len(response_ids) == len(loss_mask) == len(logprobs)


@pytest.mark.parametrize("kernel", ["static", "hf"])
def test_multi_turn_tokens_and_logprobs_are_the_engines(model_dir, tokenizer, kernel):
    engine = RecordingEngine(embedded_engine(model_dir, kernel))
    env = ScriptedEnv(done_after=4, eos_token_id=tokenizer.eos_token_id)
    requests = episode_requests(tokenizer)
    limits = EpisodeLimits(max_turns=4, max_total_tokens=90)
    episodes = run_episodes(engine.generate, requests, [{}] * len(requests), env, tokenizer, limits)

    calls = engine.by_rid()
    longest = max(len(e.turns) for e in episodes)
    assert len(engine.calls) == longest  # one generate call per turn for every live episode
    for k, (reqs, _) in enumerate(engine.calls):
        assert sorted(q.rid for q in reqs) == sorted(e.turns[k].rid for e in episodes if len(e.turns) > k)
    assert longest >= 3 and sum(len(e.turns) >= 3 for e in episodes) >= 2, [len(e.turns) for e in episodes]

    samples = []
    for q, e in zip(requests, episodes):
        check_token_exact(q.input_ids, e.response_ids, e.loss_mask, e.logprobs, e, calls, tokenizer,
                          ScriptedEnv.OBSERVATIONS)
        later = e.turns[1:]
        assert all(t.cached_tokens > 0 for t in later)  # the prefix cache served every later turn
        for prev, t in zip(e.turns, later):  # everything up to the previous turn's last fed token
            assert t.cached_tokens >= prev.input_len + prev.generated - 1
        samples.append(Sample(q.rid, list(q.input_ids), list(e.response_ids), loss_mask=list(e.loss_mask),
                              logprobs=list(e.logprobs)))

    # the engine's logprobs are the model's on the final sequence (what the trainer recomputes)
    model = engine.engine.model
    for s in samples:
        ids = torch.tensor([s.prompt_ids + s.response_ids])
        with torch.no_grad():
            logp = torch.log_softmax(model(ids).logits[0].float(), -1)
        p = len(s.prompt_ids)
        for j, (tok, m) in enumerate(zip(s.response_ids, s.loss_mask)):
            if m:
                assert abs(float(logp[p + j - 1, tok]) - s.logprobs[j]) < 1e-4

    # the trainer's batch: every token, mask and logprob at its position
    batch = build_batch([samples], pad_id=tokenizer.pad_token_id)
    for row, s in enumerate(samples):
        p, r = len(s.prompt_ids), len(s.response_ids)
        assert batch.tokens[row, p:p + r].tolist() == s.response_ids
        assert batch.loss_mask[row, :p].sum() == 0 and batch.loss_mask[row, p:p + r].tolist() == s.loss_mask
        assert batch.old_logprobs[row, p:p + r].tolist() == pytest.approx(s.logprobs, abs=0)  # fp32 of the same floats
        assert torch.equal(batch.old_logprobs[row, p:p + r], torch.tensor(s.logprobs, dtype=torch.float32))


def test_a_loop_that_re_tokenises_text_would_fail(model_dir, tokenizer):
    """Decode -> encode of the episodes' contexts is not the exact ids with this tokenizer (the model samples
    non-canonical token splits, and an observation tokenised alone splits differently from inside text), so
    the check above catches a loop that re-tokenises: applied to the re-tokenised episode it fails."""
    engine = RecordingEngine(embedded_engine(model_dir))
    env = ScriptedEnv(done_after=3, eos_token_id=tokenizer.eos_token_id)
    requests = episode_requests(tokenizer)
    episodes = run_episodes(engine.generate, requests, [{}] * len(requests), env, tokenizer,
                            EpisodeLimits(max_turns=3, max_total_tokens=90))
    calls = engine.by_rid()
    differing = 0
    for q, e in zip(requests, episodes):
        exact = list(q.input_ids) + e.response_ids
        retokenised = tokenizer(tokenizer.decode(exact, skip_special_tokens=False), add_special_tokens=False)["input_ids"]
        if retokenised == exact:
            continue
        differing += 1
        response = retokenised[len(q.input_ids):] if retokenised[:len(q.input_ids)] == list(q.input_ids) else retokenised
        mask = (e.loss_mask + [1.0] * len(response))[:len(response)]
        logprobs = (e.logprobs + [0.0] * len(response))[:len(response)]
        with pytest.raises(AssertionError):
            check_token_exact(q.input_ids, response, mask, logprobs, e, calls, tokenizer, ScriptedEnv.OBSERVATIONS)
    assert differing >= len(episodes) // 2, "decode -> encode matched the exact ids: the test would not catch it"


def test_stop_strings_of_the_environment_end_turns_in_the_engine(model_dir, tokenizer):
    """The environment's stop strings reach the engine with every turn's request and end the turn there."""
    engine = RecordingEngine(embedded_engine(model_dir))
    env = ScriptedEnv(done_after=3, stop=("e",), eos_token_id=tokenizer.eos_token_id)
    requests = episode_requests(tokenizer, max_new=24)
    episodes = run_episodes(engine.generate, requests, [{}] * len(requests), env, tokenizer,
                            EpisodeLimits(max_turns=3, max_total_tokens=120))
    stopped = 0
    for reqs, ress in engine.calls:
        for q, res in zip(reqs, ress):
            assert "e" in q.sampling.stop
            if res.finish_reason == "stop" and res.output_ids[-1] != tokenizer.eos_token_id:
                stopped += 1
                assert "e" in tokenizer.decode(res.output_ids) and "e" not in tokenizer.decode(res.output_ids[:-1])
    assert stopped >= 3
    assert all(e.finish in ("done", "max_turns", "max_total_tokens") for e in episodes)


def test_routed_experts_cover_the_episode_and_are_each_turns_own(model_dir, tokenizer):
    """With return_routed_experts the episode keeps the last turn's routing, which covers every fed token
    (prompt, earlier turns, observations); each earlier turn's generated tokens keep the routing that turn's
    engine call recorded (the prefix cache stores it with the KV)."""
    engine = RecordingEngine(embedded_engine(model_dir))
    env = ScriptedEnv(done_after=3, eos_token_id=tokenizer.eos_token_id)
    requests = episode_requests(tokenizer, routed=True)
    episodes = run_episodes(engine.generate, requests, [{}] * len(requests), env, tokenizer,
                            EpisodeLimits(max_turns=3, max_total_tokens=90))
    calls = engine.by_rid()
    for q, e in zip(requests, episodes):
        res = e.as_result()
        sample = Sample(q.rid, list(q.input_ids), list(e.response_ids), loss_mask=list(e.loss_mask),
                        logprobs=list(e.logprobs), routed_experts=res.routed_experts)  # validates the shape
        assert sample.routed_experts.shape[0] == sample.total_len - 1
        p = len(q.input_ids)
        for t in e.turns:
            turn_routing = calls[t.rid][1].routed_experts  # [input + output - 1, layers, top_k]
            rows = t.input_len + t.generated - 1
            assert torch.equal(sample.routed_experts[:rows], turn_routing[:rows]), t.rid
            assert p + t.start == t.input_len
