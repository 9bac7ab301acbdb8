"""The multi-turn loop over the SGLang protocol: the project's engine server (`python -m slime_ext.tools.serve`,
a real process) driven by `SGLangEngineClient`, against the embedded engine in this process. Same requests and
seeds: identical tokens on every turn, logprobs within the batching noise the server path has
(tests/methods/test_server_path.py: 2e-4), and the server's prefix cache serving the later turns (its
`meta_info.cached_tokens`)."""

from __future__ import annotations

import pytest

from slime_ext.engine.sglang_client import SGLangEngineClient
from slime_ext.envs.metrics import cached_token_share
from slime_ext.envs.rollout import EpisodeLimits, run_episodes
from tests.envs.conftest import RecordingEngine, ScriptedEnv, embedded_engine
from tests.envs.test_token_exact import check_token_exact, episode_requests
from tests.serving.server_process import server_process


def test_multi_turn_through_the_engine_server_matches_the_embedded_engine(model_dir, tokenizer):
    limits = EpisodeLimits(max_turns=4, max_total_tokens=90)
    requests = episode_requests(tokenizer)
    rows = [{}] * len(requests)

    def env():  # the same environment for both paths, with a stop string the model often produces
        return ScriptedEnv(done_after=4, stop=("e",), eos_token_id=tokenizer.eos_token_id)

    local = run_episodes(embedded_engine(model_dir).generate, requests, rows, env(), tokenizer, limits)
    with server_process("--model", str(model_dir), "--max-tokens", "64") as (url, _):
        client = RecordingEngine(SGLangEngineClient(url, eos_token_id=tokenizer.eos_token_id, batching="call"))
        remote = run_episodes(client.generate, requests, rows, env(), tokenizer, limits)

    calls = client.by_rid()
    for q, a, b in zip(requests, local, remote):
        assert b.response_ids == a.response_ids and b.loss_mask == a.loss_mask, q.rid
        assert [t.finish_reason for t in b.turns] == [t.finish_reason for t in a.turns] and b.finish == a.finish
        assert b.logprobs == pytest.approx(a.logprobs, abs=2e-4)
        check_token_exact(q.input_ids, b.response_ids, b.loss_mask, b.logprobs, b, calls, tokenizer,
                          ScriptedEnv.OBSERVATIONS)
        assert all(t.cached_tokens > 0 for t in b.turns[1:]), [t.cached_tokens for t in b.turns]
    assert max(len(e.turns) for e in remote) >= 3
    assert sum(t.finish_reason == "stop" for e in remote for t in e.turns) >= 2  # the stop string went over the wire
    share = cached_token_share(remote)
    print(f"cached-token share of later turns through the server: {share:.3f}")
    assert share > 0.5, share  # later turns: everything before the previous turn's last token is cached
