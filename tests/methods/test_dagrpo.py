"""DA-GRPO: the trigger sampler, dual advantage and update, splice masks, the cloud once per group over
real HTTP, failing endpoints, and the dual update steering a simulated policy to tau."""

from __future__ import annotations

import json
import math
import random

import numpy as np
import pytest
import torch

from sglang_patches.dagrpo import HelpTriggerSampler
from sglang_patches.request_sampler import RequestView, replay_annotations
from slime_ext.algo import grouped_advantages
from slime_ext.methods.dagrpo.core import composed_reward, dual_advantages, dual_update, format_ok, splice, tau_at
from slime_ext.engine.solver import CharTokenizer

TRIGGER = "I need external assistance."


def test_dual_advantage_is_the_group_advantage_of_the_shaped_reward():
    rng = random.Random(0)
    for _ in range(20):
        n = rng.randint(4, 24)
        groups = [rng.randrange(4) for _ in range(n)]
        r = [rng.choice([0.0, 0.5, 1.0]) for _ in range(n)]
        c = [float(rng.random() < 0.4) for _ in range(n)]
        lam = rng.uniform(0, 2)
        for norm in (True, False):
            got = dual_advantages(r, c, groups, lam, normalize_std=norm)
            want = grouped_advantages([ri - lam * ci for ri, ci in zip(r, c)], groups, normalize_std=norm, eps=1e-6)
            assert np.allclose(got, np.asarray(want), atol=1e-5)  # the GRPO core returns float32
    # by hand: one group, r = [1, 0], c = [1, 0], lambda 0.5 -> A = [0.5 - 0.25, -0.5 + 0.25]
    assert dual_advantages([1, 0], [1, 0], [0, 0], 0.5, normalize_std=False) == pytest.approx([0.25, -0.25])


def test_dual_advantage_of_a_group_without_variance_is_exactly_zero():
    # constant rewards not exact in binary and no cost: no signal, with or without std division (before,
    # float64 rounding left -1.4e-11 for three 0.1s and 1.1e-10 for seven 0.7s)
    for norm in (True, False):
        for v, n in ((0.1, 3), (0.2, 8), (0.7, 7)):
            assert np.array_equal(dual_advantages([v] * n, [0] * n, [0] * n, 0.3, normalize_std=norm), np.zeros(n))
    # r and c vary but r - lambda c ties (0.7 - 0.3 = 0.4 - 0, up to rounding): no signal, so 0 (before: -8.3e-11)
    assert np.array_equal(dual_advantages([0.7, 0.4], [1, 0], [0, 0], 0.3), np.zeros(2))
    # a real difference far below any reward scale still counts: [0.4 + 1e-9, 0.4] is not a tie
    assert dual_advantages([0.4 + 1e-9, 0.4], [0, 0], [0, 0], 0.3, normalize_std=False) == pytest.approx([5e-10, -5e-10])


def test_dual_update_is_projected_and_tau_schedules():
    assert dual_update(0.3, 0.5, 0.2, 1.0) == pytest.approx(0.6)
    assert dual_update(0.1, 0.0, 0.2, 1.0) == 0.0  # projected onto lambda >= 0
    assert tau_at(0, 0.2, [(10, 0.1), (20, 0.3)]) == 0.2 and tau_at(15, 0.2, [(10, 0.1), (20, 0.3)]) == 0.1
    assert tau_at(25, 0.2, [(20, 0.3), (10, 0.1)]) == 0.3


def _simulate(tau: float, lam0: float, steps: int = 2000, seed: int = 0) -> tuple[float, float]:
    """Prompts of difficulty d ~ U(0, 1): alone the policy is right with probability 1 - d, with the cloud
    always (cost 1). A logistic policy over (1, d) asks per prompt; policy gradient on the dual advantage
    and the projected dual update. Returns (mean cloud rate over the last quarter, final lambda)."""
    rng = np.random.default_rng(seed)
    theta, lam, rates = np.zeros(2), lam0, []
    groups = np.repeat(np.arange(16), 8)
    for _ in range(steps):
        d = np.repeat(rng.random(16), 8)
        x = np.stack([np.ones(128), 4 * (d - 0.5)], 1)
        p = 1 / (1 + np.exp(-(x @ theta)))
        ask = rng.random(128) < p
        r = np.where(ask, 1.0, (rng.random(128) > d).astype(float))
        a = dual_advantages(r, ask.astype(float), groups, lam, normalize_std=False)
        theta += 2.0 * np.mean((a * np.where(ask, 1 - p, -p))[:, None] * x, 0)
        lam = dual_update(lam, ask.mean(), tau, 0.02)
        rates.append(ask.mean())
    return float(np.mean(rates[-steps // 4:])), lam


def test_dual_update_drives_a_simulated_policy_to_tau():
    for tau in (0.1, 0.6):  # the corners: a low and a high budget, lambda starting below and far above 1 - tau
        for lam0 in (0.0, 2.0):
            rate, lam = _simulate(tau, lam0)
            assert abs(rate - tau) < 0.02, (tau, lam0, rate, lam)
            # the optimal policy asks when d > lambda, so the rate is 1 - lambda at equilibrium
            assert lam == pytest.approx(1 - tau, abs=0.15)


def test_format_rule_and_reward():
    good = "<think>Step 1: a = 2.\nStep 2: b = 3.</think><answer>\\boxed{3}</answer>"
    assert format_ok(good, step_limit=4) and format_ok(good.replace("<think>", "").replace("</think>", "")
                                                       .replace("<answer>", "").replace("</answer>", ""), 4, False)
    assert not format_ok(good, step_limit=1)  # too many steps
    assert not format_ok(good.replace("Step 2", "Step 3"), 4)  # numbering
    assert not format_ok(good.replace("\\boxed{3}", "3"), 4) and not format_ok(good.replace("<answer>", ""), 4)
    assert composed_reward(True, True) == 1.0 and composed_reward(True, False, 0.3) == 0.3
    assert composed_reward(False, True) == 0.0


Tok = CharTokenizer  # character-level: ids are code points, 0 is the end of sequence


def test_splice_masks_cloud_tokens_exactly():
    tok = Tok()
    local_text = "Step 1: hmm. " + TRIGGER
    local = tok(local_text)["input_ids"] + [0]
    sp = splice(local, local_text, TRIGGER, "Step 2: x = 4.\n\\boxed{4}", tok, 0)
    n_local, n_cloud = len(local) - 1, len("Step 2: x = 4.\n\\boxed{4}") + 1
    assert sp.loss_mask == [1.0] * n_local + [0.0] * n_cloud and sp.author == [1] * n_local + [2] * n_cloud
    assert tok.decode(sp.response_ids[:n_local]) == local_text  # the trigger stays trained
    assert sp.scored_text == "Step 1: hmm. Step 2: x = 4.\n\\boxed{4}"
    failed = splice(local, local_text, TRIGGER, None, tok, 0)
    assert failed.scored_text == "Step 1: hmm. " and failed.loss_mask == [1.0] * n_local
    with pytest.raises(ValueError, match="trigger"):
        splice(local, "no trigger here", TRIGGER, "x", tok, 0)


def test_trigger_sampler_ends_the_response_after_the_trigger():
    tok = Tok()
    s = HelpTriggerSampler(0, trigger=TRIGGER)
    text = "Step 1: " + TRIGGER
    ids = tok(text)["input_ids"]
    notes, out = [], []
    for t in ids:
        view = RequestView("r", 0, [5], out, 0, tok.decode)
        assert not s.adjust(torch.zeros(3), None, view).finish
        notes.append(s.on_token(t, view))
        out.append(t)
    assert notes[-1] == {"asked_for_help": True} and all(n == {} for n in notes[:-1])
    assert s.adjust(torch.zeros(3), None, RequestView("r", 0, [5], out, 0, tok.decode)).finish
    spec = {"kind": "dagrpo_trigger", "trigger": TRIGGER}
    assert replay_annotations([spec], 0, [5], ids, 0, tok.decode) == notes


# -- the cloud over HTTP ----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def cloud_server(tmp_path_factory):
    from transformers import AutoModelForCausalLM

    from slime_ext.engine.embedded import EmbeddedEngine
    from slime_ext.tools.serve import ServerState, serve
    from slime_ext.tokenizer import load_tokenizer, train_tokenizer
    from tests.megatron_fixtures import tiny_moe_config

    d = tmp_path_factory.mktemp("cloud")
    tok = train_tokenizer(["Question: what is 1 + 2?\nAnswer: Step 1: 1 + 2 = 3.\n\\boxed{3}"] * 30, vocab_size=300, out_dir=d)
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(tiny_moe_config(vocab_size=len(tok))).save_pretrained(d)
    state = ServerState(EmbeddedEngine.from_pretrained(str(d)), load_tokenizer(d), "cloud", max_tokens=6)
    srv = serve(state)
    yield f"http://127.0.0.1:{srv.server_address[1]}", state, load_tokenizer(d)
    srv.shutdown()
    state.batcher.close()


def _sample(sid, group, text, tok, asked, level=None):
    from slime_ext.data import Sample

    ids = tok(text)["input_ids"] + [tok.eos_token_id]
    notes = [{}] * (len(ids) - 1) + [{"asked_for_help": True} if asked else {}]
    return Sample(sid, [3, 4], ids, group_id=group, label="3", response_text=text, logprobs=[-0.1] * len(ids),
                  metadata={"annotations": notes, "question": f"question of {group}", "level": level})


def test_cloud_is_called_once_per_group_that_asked_and_never_otherwise(cloud_server):
    from slime_ext.config import load_config
    from slime_ext.methods.dagrpo.cloud import CloudHelper
    from slime_ext.clients.openai_client import OpenAIClient
    from slime_ext.methods.dagrpo.method import DAGRPO
    from tests.conftest import CONFIGS

    url, state, tok = cloud_server
    cfg = load_config(CONFIGS / "dagrpo.yaml", ["dagrpo.lambda_init=0.5", "dagrpo.eta_lambda=0.05"]).config
    method = DAGRPO(cfg, tok, cloud=CloudHelper(OpenAIClient(url), max_tokens=6))
    asked_text = "Step 1: " + TRIGGER
    g1 = [_sample("a", "g1", asked_text, tok, True), _sample("b", "g1", asked_text, tok, True),
          _sample("c", "g1", "Step 1: 1 + 2 = 3.\n\\boxed{3}", tok, False)]
    g2 = [_sample("d", "g2", "Step 1: 1 + 2 = 3.\n\\boxed{3}", tok, False), _sample("e", "g2", "\\boxed{4}", tok, False)]
    g3 = [_sample("f", "g3", asked_text, tok, True), _sample("g", "g3", "\\boxed{3}", tok, False)]
    before = state.openai_requests
    m = method.finish([g1, g2, g3], 0)
    assert state.openai_requests - before == 2  # g1 and g3 asked; g2 did not
    assert m["dagrpo/cloud_calls_per_group"] == pytest.approx(2 / 3) and m["dagrpo/cloud_rate"] == pytest.approx(3 / 7)
    a, b = g1[0], g1[1]
    assert a.response_ids[len(b.response_ids) - 1:] == b.response_ids[len(b.response_ids) - 1:]  # same splice
    local = len(tok(asked_text)["input_ids"])
    assert a.loss_mask[:local] == [1.0] * local and set(a.loss_mask[local:]) == {0.0} and a.author[local] == 2
    assert a.cost == 1.0 and g1[2].cost == 0.0 and len(a.logprobs) == a.response_len
    # the dual advantage with lambda 0.5 was used
    want = dual_advantages([s.reward for g in (g1, g2, g3) for s in g], [s.cost for g in (g1, g2, g3) for s in g],
                           [s.group_id for g in (g1, g2, g3) for s in g], 0.5)
    assert [s.advantage for g in (g1, g2, g3) for s in g] == pytest.approx(list(want))
    method.update({}, 0)
    assert method.lam == pytest.approx(max(0.0, 0.5 + 0.05 * (3 / 7 - 0.2)))
    assert method.state_dict()["lambda"] == method.lam


def test_a_failing_endpoint_counts_unanswered_requests_and_keeps_the_samples(cloud_server):
    from slime_ext.config import load_config
    from slime_ext.methods.dagrpo.cloud import CloudHelper
    from slime_ext.clients.openai_client import OpenAIClient
    from slime_ext.methods.dagrpo.method import DAGRPO
    from tests.conftest import CONFIGS

    _, _, tok = cloud_server
    cfg = load_config(CONFIGS / "dagrpo.yaml", []).config
    dead = CloudHelper(OpenAIClient("http://127.0.0.1:9", max_retries=1, backoff_s=0.01, timeout_s=2))
    method = DAGRPO(cfg, tok, cloud=dead)
    asked_text = "Step 1: " + TRIGGER
    g = [_sample("a", "g", asked_text, tok, True), _sample("b", "g", "\\boxed{3}", tok, False)]
    m = method.finish([g], 0)
    assert m["dagrpo/cloud_failures"] == 1 and dead.failures == 1
    assert len(g) == 2 and g[0].reward == 0.0 and g[0].cost == 1.0 and g[0].metadata["cloud_answered"] is False
    assert g[0].loss_mask == [1.0] * len(tok(asked_text)["input_ids"])


def test_cloud_rate_is_reported_per_level_when_a_phase_mixes_levels(cloud_server):
    """Whether the policy learned where to ask: the batch rate split by the prompts' task level."""
    from slime_ext.config import load_config
    from slime_ext.methods.dagrpo.cloud import CloudHelper
    from slime_ext.methods.dagrpo.method import DAGRPO
    from tests.conftest import CONFIGS

    from slime_ext.clients.openai_client import OpenAIClient

    url, _, tok = cloud_server
    method = DAGRPO(load_config(CONFIGS / "dagrpo.yaml", []).config, tok, cloud=CloudHelper(OpenAIClient(url), max_tokens=6))
    asked, kept = "Step 1: " + TRIGGER, "Step 1: 1 + 2 = 3.\n\\boxed{3}"
    easy = [_sample("a", "e", kept, tok, False, "L1"), _sample("b", "e", asked, tok, True, "L1"),
            _sample("c", "e", kept, tok, False, "L1")]
    hard = [_sample("d", "h", asked, tok, True, "L4"), _sample("e", "h", asked, tok, True, "L4")]
    m = method.finish([easy, hard], 0)
    assert m["dagrpo/cloud_rate"] == pytest.approx(3 / 5)
    assert m["dagrpo/cloud_rate/L1"] == pytest.approx(1 / 3) and m["dagrpo/cloud_rate/L4"] == 1.0
    assert m["dagrpo/groups_split_on_asking"] == 0.5  # the hard group all asked: no cost advantage there
    one_level = method.finish([[_sample("f", "x", asked, tok, True, "L4"), _sample("g", "x", kept, tok, False, "L4")]], 1)
    assert not any(k.startswith("dagrpo/cloud_rate/") for k in one_level)


def test_the_log_says_when_no_group_is_split_on_asking(cloud_server, caplog):
    """Asking always (or never) leaves every group's cost advantage at zero: the run log names it once."""
    from slime_ext.config import load_config
    from slime_ext.methods.dagrpo.cloud import CloudHelper
    from slime_ext.clients.openai_client import OpenAIClient
    from slime_ext.methods.dagrpo.method import DAGRPO, STUCK_STEPS
    from tests.conftest import CONFIGS

    url, _, tok = cloud_server
    method = DAGRPO(load_config(CONFIGS / "dagrpo.yaml", []).config, tok, cloud=CloudHelper(OpenAIClient(url), max_tokens=6))
    asked = "Step 1: " + TRIGGER
    with caplog.at_level("WARNING", logger="slime_ext.methods.dagrpo.method"):
        for step in range(STUCK_STEPS + 2):
            m = method.finish([[_sample(f"{step}{i}", f"g{step}", asked, tok, True) for i in range(2)]], step)
            assert m["dagrpo/groups_split_on_asking"] == 0.0
    warnings = [r for r in caplog.records if "no prompt group was split on asking" in r.getMessage()]
    assert len(warnings) == 1 and f"step {STUCK_STEPS - 1}:" in warnings[0].getMessage()


def test_warm_start_rows_include_trigger_examples():
    from slime_ext.methods.dagrpo.core import with_trigger_examples

    rows = [{"id": i, "prompt": f"q{i}", "label": "1", "solution": "Step 1: a = 1.\nStep 2: b = 1.\n\\boxed{1}"}
            for i in range(400)]
    out = with_trigger_examples(rows, TRIGGER, 0.15, seed=0)
    asked = [r for r in out if r["solution"].endswith(TRIGGER)]
    assert abs(len(asked) / 400 - 0.15) < 4 * math.sqrt(0.15 * 0.85 / 400)
    assert all(r["solution"] == "Step 1: a = 1.\n" + TRIGGER for r in asked)
    assert out == with_trigger_examples(rows, TRIGGER, 0.15, seed=0)  # deterministic
    assert with_trigger_examples(rows, TRIGGER, 0.0) == rows


def test_v2_references_through_the_warm_start_trigger_splice_and_format_rule():
    """Task family v2's rows end with `\\boxed{N}` or with a re-check tail after it (`Check: ... \\boxed{N}`): the
    warm start's asking rows show the answer line, never the tail, and a response that asks after its first step
    and gets the exact solver's answer scores as right and well formatted at the level's step limit."""
    from slime_ext.engine.solver import SOLVERS
    from slime_ext.envs.tool_call import format_call, format_observation
    from slime_ext.methods.dagrpo.core import answer_line, with_trigger_examples
    from slime_ext.rewards.math_verifier import verify_math
    from slime_ext.tasks.synthetic_math import generate_dataset

    tok = CharTokenizer()
    rows = generate_dataset(["V3", "V6", "V10"], 60, seed=0, split="eval", recheck_share=0.5)
    assert 0 < sum(r["recheck"] for r in rows) < len(rows)
    splice_rows = with_trigger_examples(rows, TRIGGER, 1.0)
    tool_rows = with_trigger_examples(rows, TRIGGER, 1.0, tool="cloud")
    for row, asks, calls in zip(rows, splice_rows, tool_rows):
        boxed, first = f"\\boxed{{{row['label']}}}", row["solution"].split("\n")[0]
        assert answer_line(row["solution"]) == boxed
        assert answer_line(row["solution"].replace("\n", "\n\n")) == boxed  # step_separator "\n\n"
        assert asks["solution"] == f"{first}\n{TRIGGER}"
        assert calls["solution"] == f"{first}\n{format_call('cloud', TRIGGER)}{format_observation(boxed, False)}{boxed}"
        # a full reference (tail or not) meets the format rule at exactly its step count
        n = row["num_steps"]
        assert format_ok(row["solution"], n, require_tags=False) and not format_ok(row["solution"], n - 1, False)
        # the trigger, then the `solver:synthetic_math_answer` cloud's completion in its place
        cloud = SOLVERS["synthetic_math_answer"](row["prompt"])
        assert cloud == boxed
        ids = tok(asks["solution"])["input_ids"] + [tok.eos_token_id]
        sp = splice(ids, asks["solution"], TRIGGER, cloud, tok, tok.eos_token_id)
        assert sp.scored_text == f"{first}\n{boxed}" and verify_math(sp.scored_text, row["label"]).score == 1.0
        assert format_ok(sp.scored_text, n, require_tags=False)


def test_v2_phases_build_their_warm_start_rows(tmp_path):
    """A DA-GRPO config whose phases are v2 levels builds its warm start from the phases' rows, on both paths."""
    from slime_ext.config import load_config
    from slime_ext.methods.dagrpo.cloud import CloudHelper
    from slime_ext.methods.dagrpo.method import DAGRPO
    from tests.conftest import CONFIGS

    overrides = [f"run.cache_dir={tmp_path}", "data.synthetic.n_train=30", "data.synthetic.n_eval=8",
                 "data.synthetic.train_levels=[V3, V7]", "data.synthetic.eval_levels=[V3, V7]",
                 "data.synthetic.recheck_share=1.0", "dagrpo.sft_trigger_fraction=0.5",
                 "dagrpo.phases=[{name: easy, levels: [V3], steps: 20, step_limit: 3}, "
                 "{name: hard, levels: [V7], steps: 20, step_limit: 7}]"]
    for config, asked in (("dagrpo.yaml", TRIGGER), ("dagrpo_tools.yaml", "<tool>cloud</tool>")):
        cfg = load_config(CONFIGS / config, overrides).config
        rows = DAGRPO(cfg, CharTokenizer(), cloud=CloudHelper(None)).warm_start_rows([], seed=0)
        assert len(rows) == 60 and {r["level"] for r in rows} == {"V3", "V7"}
        asking = [r for r in rows if asked in r["solution"]]
        assert 0 < len(asking) < len(rows)
        assert all("Check:" in r["solution"] for r in rows if r not in asking)  # share 1.0: every reference has a tail
        assert all("Check:" not in r["solution"] for r in asking)
        assert all(r["solution"].endswith(f"\\boxed{{{r['label']}}}") for r in asking if asked != TRIGGER)


def test_router_baselines():
    from slime_ext.methods.dagrpo.routers import (LogisticRouter, prompt_features, random_route, route_by_score,
                                          routed_scores)

    rng = np.random.default_rng(0)

    def prompts(n):
        out, fail = [], []
        for _ in range(n):
            k = int(rng.integers(1, 6))
            out.append(" ".join(f"Add {int(rng.integers(1, 90))}." for _ in range(k)) + " How many?")
            fail.append(rng.random() < 0.15 * k)  # more operations, more local failures
        return out, np.array(fail)

    train_p, train_fail = prompts(400)
    eval_p, eval_fail = prompts(400)
    feats = np.stack([prompt_features(p) for p in train_p])
    router = LogisticRouter().fit(feats, train_fail)
    proba = router.predict_proba(np.stack([prompt_features(p) for p in eval_p]))
    local_correct, cloud_correct = (~eval_fail).astype(float), np.ones(400)
    learned = routed_scores(local_correct, cloud_correct, route_by_score(proba, 0.3))
    rand = routed_scores(local_correct, cloud_correct, random_route(400, 0.3, seed=1))
    assert learned["cloud_rate"] == rand["cloud_rate"] == 0.3
    assert learned["joint_accuracy"] > rand["joint_accuracy"] + 0.03  # routing by difficulty pays
    assert routed_scores([1, 0, 1], [1, 1, 0], np.array([False, True, False])) == {
        "joint_accuracy": 1.0, "cloud_rate": pytest.approx(1 / 3), "local_only_accuracy": 1.0}


def test_local_only_baseline_needs_no_cloud_and_never_asks():
    from slime_ext.config import load_config
    from slime_ext.methods.registry import build_method
    from tests.conftest import CONFIGS

    tok = Tok()
    method = build_method(load_config(CONFIGS / "dagrpo_local_only.yaml", []).config, tok)
    (plan,) = method.plan([{"prompt": "q"}], 0)
    assert plan.sampler_specs == []
    g = [_sample("a", "g", "Step 1: 1 + 2 = 3.\n\\boxed{3}", tok, False), _sample("b", "g", "\\boxed{4}", tok, False)]
    m = method.finish([g], 0)
    assert m["dagrpo/cloud_rate"] == 0.0 and method.cloud.calls == 0
    with pytest.raises(ValueError, match="dagrpo.cloud_url"):
        build_method(load_config(CONFIGS / "dagrpo.yaml", ["dagrpo.cloud_url=null"]).config, tok)


def test_solver_cloud_over_http_answers_exactly_and_counts_calls():
    """The embedded study's 'cloud': an exact solver behind the same OpenAI routes and client."""
    from sglang_patches.decoding import SamplingParams
    from slime_ext.methods.dagrpo.cloud import CloudHelper
    from slime_ext.data.generation import GenerateRequest
    from slime_ext.clients.openai_client import OpenAIClient
    from slime_ext.engine.solver import UNSOLVED, SolverEngine
    from slime_ext.rewards.math_verifier import verify_math
    from slime_ext.tools.serve import ServerState, serve
    from slime_ext.tasks.synthetic_math import generate_dataset

    engine = SolverEngine("synthetic_math")
    state = ServerState(engine, engine.tokenizer, "solver", max_tokens=8)
    srv = serve(state)
    try:
        rows = generate_dataset(["L4"], 5, seed=1, split="eval")
        cloud = CloudHelper(OpenAIClient(f"http://127.0.0.1:{srv.server_address[1]}"), max_tokens=8)
        answers = cloud.answer([rows[0]["prompt"], None, rows[2]["prompt"], "no story here"])
        assert answers[0] == rows[0]["solution"] and answers[2] == rows[2]["solution"]  # max_tokens not applied
        assert answers[1] is None and answers[3] == UNSOLVED
        assert verify_math(answers[0], rows[0]["label"]).score > 0
        assert cloud.calls == 3 and cloud.failures == 0 and state.openai_requests == 3
    finally:
        srv.shutdown()
        state.batcher.close()
    (only_answer,) = SolverEngine("synthetic_math_answer").generate([GenerateRequest("a", list(map(ord, rows[0]["prompt"])),
                                                                                      SamplingParams(), 0)])
    assert engine.tokenizer.decode(only_answer.output_ids) == f"\\boxed{{{rows[0]['label']}}}"
    with pytest.raises(ValueError, match="unknown solver 'chess'"):
        SolverEngine("chess")


def test_phase_steps_must_add_up_to_the_rl_steps():
    from slime_ext.config import ConfigError, load_config
    from tests.conftest import CONFIGS

    with pytest.raises(ConfigError, match=r"train.steps \(30\) must equal the sum of dagrpo.phases\[\*\].steps \(20 \+ 20 = 40\)"):
        load_config(CONFIGS / "dagrpo.yaml", ["train.steps=30"])


def test_warm_start_is_shared_across_phase_orders_steps_targets_and_the_local_only_baseline(tmp_path):
    """A study's arms over the same tasks reuse one SFT: the key and rows depend on the phases' data only."""
    from slime_ext.config import load_config
    from slime_ext.orchestration.training_job import TrainingJob
    from tests.conftest import CONFIGS

    class LenTok(CharTokenizer):
        pad_token_id = 0

        def __len__(self):
            return 256

    def job(*overrides):
        # one character per token: L4 prompts reach ~300 tokens, so the prompt limit is raised to keep them
        cfg = load_config(CONFIGS / "dagrpo.yaml", [f"run.cache_dir={tmp_path}", "data.synthetic.n_train=30",
                                                    "data.synthetic.n_eval=8", "rollout.max_prompt_len=600",
                                                    *overrides]).config
        return TrainingJob(cfg, tmp_path, [], [], LenTok(), tmp_path / "tok")

    base = job()
    reverse = job("dagrpo.phases=[{name: hard, levels: [L4], steps: 30, tau: 0.4}, {name: easy, levels: [L1], steps: 10}]")
    hard_only = job("train.steps=24", "dagrpo.phases=[{name: hard, levels: [L4], steps: 24}, {name: easy, levels: [L1], steps: 0}]")
    assert base.warm_start_key() == reverse.warm_start_key() == hard_only.warm_start_key()
    assert [r["id"] for r in base.sft_rows()] == [r["id"] for r in reverse.sft_rows()]
    assert len(base.sft_rows()) == 60 and {r["level"] for r in base.sft_rows()} == {"L1", "L4"}
    assert job("dagrpo.local_only=true").warm_start_key() == base.warm_start_key()
    # a phase mixing both levels adds no data of its own: its rows are drawn from the same per-level streams
    mixed = job("train.steps=40", "dagrpo.phases=[{name: mixed, levels: [L1, L4], steps: 40, tau: 0.5}]")
    assert mixed.warm_start_key() == base.warm_start_key()
    assert [r["id"] for r in mixed.sft_rows()] == [r["id"] for r in base.sft_rows()]
    from slime_ext.methods.dagrpo.method import load_phase_rows

    mixed_train = load_phase_rows(mixed.cfg, 0)[0]
    assert {r["level"] for r in mixed_train} == {"L1", "L4"}
    assert {r["id"] for r in mixed_train} <= {r["id"] for r in base.sft_rows()}
    assert job("dagrpo.phases=[{name: a, levels: [L2], steps: 20}, {name: b, levels: [L4], steps: 20}]").warm_start_key() \
        != base.warm_start_key()


# -- a slow or dead cloud: circuit breaker, per-step counts, warnings --------------------------------
class FakeClock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def test_circuit_breaker_opens_cools_down_and_probes():
    from slime_ext.clients.circuit_breaker import CircuitBreaker

    clock = FakeClock()
    b = CircuitBreaker(failures=3, cooldown_s=10.0, clock=clock)
    b.record_failure(), b.record_failure()
    assert b.allow() and b.state == "closed"
    b.record_success()  # a success resets the count: failures must be consecutive
    b.record_failure(), b.record_failure()
    assert b.allow()
    b.record_failure()
    assert b.state == "open" and not b.allow() and b.opened == 1
    clock.t = 9.9
    assert not b.allow()
    clock.t = 10.0
    assert b.allow() and b.state == "half_open" and not b.allow()  # one probe only
    b.record_failure()  # the probe failed: open again at once, for a new cool-down
    assert b.state == "open" and b.opened == 2 and not b.allow()
    clock.t = 20.0
    assert b.allow()
    b.record_success()
    assert b.state == "closed" and b.allow() and b.allow()
    with pytest.raises(ValueError, match="failures must be >= 1"):
        CircuitBreaker(failures=0)


def _dead_endpoint(monkeypatch, clock: FakeClock, timeout_s: float) -> list[float]:
    """OpenAIClient._post that times out after `timeout_s` of the fake clock; backoff sleeps advance it too.
    Returns the list of attempt start times."""
    from slime_ext.clients import openai_client

    attempts: list[float] = []

    def post(self, path, payload, stream=False):
        attempts.append(clock.t)
        clock.t += timeout_s
        raise TimeoutError("timed out")

    monkeypatch.setattr(openai_client.OpenAIClient, "_post", post)
    monkeypatch.setattr(openai_client.time, "sleep", lambda s: setattr(clock, "t", clock.t + s))
    return attempts


def test_eight_failing_calls_cost_at_most_n_attempts_with_the_breaker(monkeypatch):
    """At the defaults (30 s timeout, 3 retries, backoff 0.5/1/2 s) one failing call costs 4 x 30 + 3.5 =
    123.5 s; 8 of them one at a time 988 s (248 s at concurrency 4, the issue's figure) and 32 attempts.
    With the breaker (5 failures, 60 s): call 1 fails its 4 attempts (123.5 s), call 2 its first (30 s +
    the 0.5 s backoff before the refused retry), the breaker opens and calls 3-8 are skipped at once."""
    from slime_ext.clients.circuit_breaker import CircuitBreaker
    from slime_ext.clients.openai_client import CallSkipped, OpenAIClient
    from slime_ext.methods.dagrpo.cloud import CloudHelper

    convs = [f"question {i}" for i in range(8)]
    clock = FakeClock()
    attempts = _dead_endpoint(monkeypatch, clock, 30.0)
    plain = CloudHelper(OpenAIClient("http://cloud", timeout_s=30, max_retries=3, max_concurrency=1))
    answers, tally = plain.ask(convs)
    assert answers == [None] * 8 and (tally.calls, tally.failed, tally.skipped) == (8, 8, 0)
    assert len(attempts) == 32 and clock.t == pytest.approx(8 * 123.5)

    clock.t, attempts[:] = 0.0, []
    client = OpenAIClient("http://cloud", timeout_s=30, max_retries=3, max_concurrency=1,
                          breaker=CircuitBreaker(5, 60.0, clock=clock))
    answers, tally = CloudHelper(client).ask(convs)
    assert answers == [None] * 8 and (tally.calls, tally.failed, tally.skipped) == (8, 2, 6)
    assert len(attempts) == 5 and clock.t == pytest.approx(123.5 + 30.5)
    assert tally.failure_rate == 1.0 and client.stats["skipped"] == 6 and client.stats["attempts"] == 5
    # still open: the next step's calls are skipped without an attempt
    with pytest.raises(CallSkipped, match="circuit breaker is open after 5 failed attempts"):
        client.chat([{"role": "user", "content": "q"}])
    assert len(attempts) == 5
    # after the cool-down one probe goes out (and fails: open again); the rest of the batch is skipped
    clock.t += 60.0
    _, tally = CloudHelper(client).ask(convs[:3])
    assert len(attempts) == 6 and (tally.failed, tally.skipped) == (1, 2)


class HeldBackend:
    """A failing backend that holds each attempt until `parties` attempts are in flight (or `hold_s` passes),
    so concurrent calls really overlap: without counting calls in flight every thread gets an attempt in."""

    def __init__(self, parties: int, hold_s: float = 0.5):
        import threading

        self.parties, self.hold_s = parties, hold_s
        self.attempts = 0
        self._lock, self._all_in = threading.Lock(), threading.Event()

    def __call__(self, *args, **kwargs):
        with self._lock:
            self.attempts += 1
            if self.attempts >= self.parties:
                self._all_in.set()
        self._all_in.wait(self.hold_s)
        raise ConnectionError("refused")


@pytest.mark.parametrize("threads", [5, 8, 16])
def test_breaker_admits_no_more_attempts_than_can_fail_before_it_opens(threads):
    """N threads each asking the breaker and failing their attempt at once: exactly `failures` (5) attempts
    reach the backend; the rest are refused (before, all N got through and the breaker opened after N)."""
    from concurrent.futures import ThreadPoolExecutor

    from slime_ext.clients.circuit_breaker import CircuitBreaker

    breaker, backend = CircuitBreaker(failures=5, cooldown_s=60.0), HeldBackend(threads)

    def call(_: int) -> str:
        if not breaker.allow():
            return "refused"
        try:
            backend()
        except ConnectionError:
            breaker.record_failure()
            return "failed"
        return "ok"

    with ThreadPoolExecutor(max_workers=threads) as pool:
        outcomes = list(pool.map(call, range(threads)))
    assert backend.attempts == 5 and outcomes.count("failed") == 5 and outcomes.count("refused") == threads - 5
    assert breaker.state == "open" and breaker.opened == 1 and not breaker.allow()


def test_a_waiting_attempt_is_admitted_when_one_in_flight_succeeds_or_is_released():
    """At capacity (failures - consecutive failures in flight) `allow()` waits rather than refusing: the
    endpoint may be fine. A success or a `release` (an interrupted caller) lets the waiter in."""
    import threading

    from slime_ext.clients.circuit_breaker import CircuitBreaker

    b = CircuitBreaker(failures=2, cooldown_s=60.0)
    assert b.allow() and b.allow() and b.in_flight == 2
    got: list[bool] = []
    waiter = threading.Thread(target=lambda: got.append(b.allow()))
    waiter.start()
    waiter.join(0.2)
    assert waiter.is_alive() and not got  # waiting: two in flight could still open it
    b.record_success()
    waiter.join(5)
    assert got == [True] and b.in_flight == 2
    b.record_failure()  # 1 failure + 1 in flight = 2: full again
    waiter = threading.Thread(target=lambda: got.append(b.allow()))
    waiter.start()
    waiter.join(0.2)
    assert waiter.is_alive()
    b.release()
    waiter.join(5)
    assert got == [True, True] and b.state == "closed" and b.in_flight == 1


def test_breaker_bounds_attempts_with_concurrent_calls(monkeypatch):
    """8 calls with 8 in flight (3 retries each) against a dead endpoint: exactly 5 attempts are made
    (before: 8 to 11, the issue's 6-8 at 4 in flight); the calls that got no attempt fail fast with
    CallSkipped (the breaker's open error), the others fail with their retries cut off."""
    from concurrent.futures import ThreadPoolExecutor

    from slime_ext.clients import openai_client
    from slime_ext.clients.circuit_breaker import CircuitBreaker
    from slime_ext.clients.openai_client import CallFailed, CallSkipped

    backend = HeldBackend(8)
    monkeypatch.setattr(openai_client.OpenAIClient, "_post", backend)
    monkeypatch.setattr(openai_client.time, "sleep", lambda s: None)
    client = openai_client.OpenAIClient("http://cloud", max_retries=3, max_concurrency=8, breaker=CircuitBreaker(5, 60.0))
    with ThreadPoolExecutor(max_workers=8) as pool:
        results = list(pool.map(lambda i: _chat_or_error(client, f"q{i}"), range(8)))
    assert backend.attempts == 5 and client.stats["attempts"] == 5
    assert sum(isinstance(r, CallSkipped) for r in results) == 3
    assert all(isinstance(r, CallFailed) for r in results) and client.stats["skipped"] == 3
    assert client.breaker.state == "open"


def _chat_or_error(client, question: str):
    from slime_ext.clients.openai_client import CallFailed

    try:
        return client.chat([{"role": "user", "content": question}])
    except CallFailed as exc:
        return exc


class ScriptedClient:
    """chat_many answering each conversation with the next scripted outcome: 'ok', 'fail' or 'skip'."""

    def __init__(self, outcomes: list[str]):
        self.outcomes = list(outcomes)

    def chat_many(self, convs, **params):
        from slime_ext.clients.openai_client import CallFailed, CallSkipped, ChatResult

        made = {"ok": lambda: ChatResult("Step 2: 1 + 2 = 3.\n\\boxed{3}", "stop"), "fail": lambda: CallFailed("timeout"),
                "skip": lambda: CallSkipped("breaker open")}
        return [made[self.outcomes.pop(0)]() for _ in convs]


def test_step_metrics_count_failed_and_skipped_calls_and_warn_past_the_rate(cloud_server, caplog):
    from slime_ext.config import load_config
    from slime_ext.methods.dagrpo.cloud import CloudHelper
    from slime_ext.methods.dagrpo.method import DAGRPO
    from tests.conftest import CONFIGS

    _, _, tok = cloud_server
    asked = "Step 1: " + TRIGGER
    groups = lambda: [[_sample(f"{g}a", g, asked, tok, True), _sample(f"{g}b", g, "\\boxed{3}", tok, False)]  # noqa: E731
                      for g in ("g1", "g2", "g3")]
    cfg = load_config(CONFIGS / "dagrpo.yaml", ["dagrpo.cloud_failure_warn_rate=0.5"]).config
    method = DAGRPO(cfg, tok, cloud=CloudHelper(ScriptedClient(["ok", "fail", "skip", "ok", "ok", "fail"])))
    with caplog.at_level("WARNING", logger="slime_ext.methods.dagrpo.cloud"):
        gs = groups()
        m = method.finish(gs, 7)
        # 3 groups asked: one answered, one failed, one skipped by the breaker -> 2/3 unanswered > 0.5
        assert (m["dagrpo/cloud_calls"], m["dagrpo/cloud_failures"], m["dagrpo/cloud_skipped"]) == (3.0, 1.0, 1.0)
        assert m["dagrpo/cloud_failure_rate"] == pytest.approx(2 / 3) and m["dagrpo/cloud_degraded"] == 1.0
        assert [g[0].metadata["cloud_answered"] for g in gs] == [True, False, False]  # skipped = unanswered
        m = method.finish(groups(), 8)  # ok, ok, fail: 1/3 <= 0.5, no warning
        assert m["dagrpo/cloud_failure_rate"] == pytest.approx(1 / 3) and m["dagrpo/cloud_degraded"] == 0.0
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 1 and warnings[0].startswith("DA-GRPO step 7: 2 of 3 cloud calls got no answer (1 failed, 1 skipped")
    assert method.cloud.calls == 6 and method.cloud.failures == 2 and method.cloud.skipped == 1


def test_phase_evaluation_counts_cloud_failures_and_reports_them(cloud_server, tmp_path, caplog):
    from types import SimpleNamespace

    from slime_ext.config import load_config
    from slime_ext.methods.dagrpo.cloud import CloudHelper
    from slime_ext.methods.dagrpo.continual import evaluate_phases
    from slime_ext.methods.dagrpo.method import DAGRPO
    from tests.conftest import CONFIGS

    _, _, tok = cloud_server
    texts = ["Step 1: " + TRIGGER, "Step 1: 1 + 2 = 3.\n\\boxed{3}", "Step 1: " + TRIGGER, "\\boxed{4}"]

    class FakeEngine:
        def generate(self, reqs):
            return [SimpleNamespace(output_ids=tok(t)["input_ids"] + [tok.eos_token_id],
                                    annotations=[{"asked_for_help": True}] if "assistance" in t else [{}])
                    for t in texts[:len(reqs)]]

    cfg = load_config(CONFIGS / "dagrpo.yaml", ["eval.n_prompts=4"]).config
    rows = [{"prompt": f"what is 1 + 2? ({i})", "label": "3"} for i in range(4)]
    # the two that asked: one answered, one failed; the router baselines ask for the two that did not: both skipped
    method = DAGRPO(cfg, tok, cloud=CloudHelper(ScriptedClient(["ok", "fail", "skip", "skip"])))
    out = method.evaluate_rows(FakeEngine(), rows, cfg.data.template)
    assert (out["cloud_calls"], out["cloud_failures"], out["cloud_skipped"]) == (4.0, 1.0, 2.0)
    assert out["cloud_failure_rate"] == 0.75 and out["joint_accuracy"] == 0.5  # the answered ask and the local 3
    # evaluate_phases writes the counts, warns, and the table says its accuracies are lower bounds
    method.phase_rows = lambda k: ([], rows)
    method.cloud = CloudHelper(ScriptedClient(["ok", "fail", "skip", "skip"] * len(cfg.dagrpo.phases)))
    with caplog.at_level("WARNING", logger="slime_ext.methods.dagrpo.cloud"):
        evaluate_phases(method, FakeEngine(), 0, tmp_path)
    first = cfg.dagrpo.phases[0].name
    saved = __import__("json").loads((tmp_path / "eval_after_phase_0.json").read_text())
    assert saved[first]["cloud_failures"] == 1.0 and saved[first]["cloud_skipped"] == 2.0
    assert any(f"DA-GRPO evaluation of {first} after phase 0: 3 of 4 cloud calls" in r.getMessage() for r in caplog.records)
    n = len(cfg.dagrpo.phases)
    assert f"{3 * n} of {4 * n} cloud calls of the last evaluation got no answer" in (tmp_path / "continual_table.md").read_text()
    # per-prompt records beside the aggregates: prompts 0 and 2 asked (0 answered, 2's call failed), 1 right locally
    records = [__import__("json").loads(x) for x in (tmp_path / "eval_after_phase_0.records.jsonl").read_text().splitlines()]
    assert len(records) == 4 * n and {r["phase"] for r in records} == {p.name for p in cfg.dagrpo.phases}
    assert [(r["asked"], r["cloud_answered"], r["correct"]) for r in records[:4]] == [
        (True, True, 1.0), (False, False, 1.0), (True, False, 0.0), (False, False, 0.0)]


def test_sampled_phase_evaluation_reports_the_sampled_policys_rate_beside_the_greedy_one(cloud_server, tmp_path):
    """`dagrpo.eval_sampled`: each phase is evaluated greedily (the default) and once more with one answer per prompt
    sampled at eval.temperature; a policy that asks only when sampled shows cloud rate 0 greedy and 1 sampled."""
    from types import SimpleNamespace

    from slime_ext.config import load_config
    from slime_ext.methods.dagrpo.cloud import CloudHelper
    from slime_ext.methods.dagrpo.continual import evaluate_phases
    from slime_ext.methods.dagrpo.method import DAGRPO
    from tests.conftest import CONFIGS

    _, _, tok = cloud_server
    seen: list[float] = []

    class TemperatureEngine:  # greedy: answers 3 locally; sampled: asks for help
        def generate(self, reqs):
            seen.extend(r.sampling.temperature for r in reqs)
            text = "\\boxed{3}" if reqs[0].sampling.temperature == 0 else "Step 1: " + TRIGGER
            return [SimpleNamespace(output_ids=tok(text)["input_ids"] + [tok.eos_token_id],
                                    annotations=[{"asked_for_help": "assistance" in text}]) for _ in reqs]

    cfg = load_config(CONFIGS / "dagrpo.yaml", ["eval.n_prompts=3", "eval.temperature=0.7",
                                                "dagrpo.eval_sampled=true"]).config
    rows = [{"prompt": f"what is 1 + 2? ({i})", "label": "3"} for i in range(3)]
    method = DAGRPO(cfg, tok, cloud=CloudHelper(ScriptedClient(["ok"] * 30)))
    method.phase_rows = lambda k: ([], rows)
    out = evaluate_phases(method, TemperatureEngine(), 0, tmp_path)
    n = len(cfg.dagrpo.phases)
    assert seen.count(0.7) == 3 * n and seen.count(0.0) >= 3 * n  # the router baselines may add greedy calls
    first = out[cfg.dagrpo.phases[0].name]
    assert first["cloud_rate"] == 0.0 and first["joint_accuracy"] == 1.0 and first["local_only_accuracy"] == 1.0
    assert first["sampled/cloud_rate"] == 1.0 and first["sampled/cloud_calls"] == 3.0
    assert math.isnan(first["sampled/local_only_accuracy"])
    records = [json.loads(x) for x in (tmp_path / "eval_after_phase_0.records.jsonl").read_text().splitlines()]
    assert [r["decoding"] for r in records[:6]] == ["greedy"] * 3 + ["sampled"] * 3
    assert [r["asked"] for r in records[:6]] == [False] * 3 + [True] * 3
    assert first["sampled/joint_accuracy"] == 1.0  # the cloud answered the three
    # the table's last columns: greedy cloud rate 0, the two routers, then the sampled joint accuracy / cloud rate
    assert "| 0.000 | 1.000 | 1.000 | 1.000 / 1.000 |" in (tmp_path / "continual_table.md").read_text()
    # off by default: greedy only
    assert not load_config(CONFIGS / "dagrpo.yaml", []).config.dagrpo.eval_sampled


def test_breaker_and_warning_keys_are_used_and_validated():
    from slime_ext.config import ConfigError, load_config
    from slime_ext.methods.dagrpo.method import cloud_client
    from tests.conftest import CONFIGS

    d = load_config(CONFIGS / "dagrpo.yaml", ["dagrpo.cloud_breaker_failures=7", "dagrpo.cloud_breaker_cooldown_s=12.5",
                                              "dagrpo.cloud_timeout_s=9", "dagrpo.cloud_retries=1"]).config.dagrpo
    client = cloud_client(d)
    assert (client.breaker.failures, client.breaker.cooldown_s, client.timeout_s, client.max_retries) == (7, 12.5, 9.0, 1)
    for bad in ("dagrpo.cloud_breaker_failures=0", "dagrpo.cloud_breaker_cooldown_s=0", "dagrpo.cloud_failure_warn_rate=1.5"):
        with pytest.raises(ConfigError, match=bad.split("=")[0].split(".")[1]):
            load_config(CONFIGS / "dagrpo.yaml", [bad])
