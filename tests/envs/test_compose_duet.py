"""DUET on multi-turn episodes (issue 31, item 6): the token budget, L_q, the K window and the cost metrics count
the tokens the policy generated in every turn of an episode, never the observation tokens; the gate is off
across turns, and its keys (and DUET on Tandem) are config errors with `rollout.env`.

Episodes of the real `tools` environment (calculator) over a scripted engine in a character tokenizer, so every
count is known by hand: a turn's text is its tokens, a calculator answer `N` is the observation
`\\n<output>\\nN\\n</output>\\n` (21 + len(N) tokens)."""

from __future__ import annotations

import re

import pytest

from slime_ext.config import ConfigError, load_config
from slime_ext.orchestration.rollout_manager import RolloutManager
from tests.conftest import CONFIGS
from tests.envs.test_compose_dagrpo import TOK, ScriptedEngine

CALC = "<tool>calculator</tool>"  # 23 tokens
ROWS = [{"prompt": "q0: what is 2 plus 3?", "label": "5", "row_id": 0},
        {"prompt": "q1: what is 10 times 10 plus 1?", "label": "101", "row_id": 1}]
SCRIPTS = {  # (question, sample) -> the model's text per turn; a final answer ends with EOS (one more token)
    (0, 0): [CALC + "<input>2+3</input>", "\\boxed{5}"],  # generated 41 + 10 = 51, observation 22
    (0, 1): ["\\boxed{6}"],  # generated 10 (wrong)
    (1, 0): [CALC + "<input>10*10</input>", CALC + "<input>100+1</input>", "\\boxed{101}"],  # 43 + 43 + 12 = 98, obs 24 + 24
    (1, 1): ["\\boxed{7}"],  # generated 10 (wrong)
}
GENERATED = {(0, 0): 51, (0, 1): 10, (1, 0): 98, (1, 1): 10}
OBSERVED = {(0, 0): 22, (0, 1): 0, (1, 0): 48, (1, 1): 0}


def policy(rid: str, text: str, seed: int) -> str:
    q = int(re.search(r"q(\d+):", text).group(1))
    k = int(re.search(r"-k(\d+)", rid).group(1))
    turn = int(re.search(r"-t(\d+)$", rid).group(1)) if re.search(r"-t\d+$", rid) else 0
    out = SCRIPTS[(q, k)][turn]
    return out + " never emitted" if out.endswith("</input>") else out


class RecordingScripted(ScriptedEngine):
    def __init__(self):
        super().__init__(policy)
        self.specs: list = []

    def generate(self, requests):
        self.specs += [q.sampler_specs for q in requests]
        return super().generate(requests)


def config(*overrides: str):
    base = ["rollout.manager=driver", "rollout.prompts_per_step=2", "rollout.n_samples_per_prompt=2",
            "rollout.max_response_len=256", "duet.budget_fraction=1.0", "grpo.normalize_std=false"]
    return load_config(CONFIGS / "duet_tools.yaml", base + list(overrides)).config


def test_the_budget_and_costs_count_every_turns_generated_tokens_and_no_observation():
    """Step 0 plans cold (L_q = L_max / 2 = 128 each, B = 1.0 x 2 rollouts x 256 = 512, n_q = 2); its episodes
    generate 51 + 10 (q0) and 98 + 10 (q1) tokens, and 22 + 48 observation tokens on top. So
      duet/generated_tokens = duet/budgeted_tokens = rollout/generated_tokens = 169   (239 with observations,
                                                                                         104 counting turn 0 only)
      L_q0 = (51 + 10) / 2 = 30.5, L_q1 = (98 + 10) / 2 = 54    (41.5 / 78 with observations, 25.5 / 26.5 turn 0)
      step 1's B = 1.0 x 2 x (30.5 + 54) = 169                   (239 / 104)
      the K window holds the natural lengths 51, 10, 98, 10
      sigma_q0 = std(A x sum log pi) = std(0.5 x -5.1, -0.5 x -1.0) = 1.525 (logprob -0.1 per generated token)."""
    engine = RecordingScripted()
    manager = RolloutManager(config(), ROWS, TOK, engine)
    groups, m = manager.rollout(0)
    samples = {(int(s.metadata["row_id"]), int(s.sample_id.rsplit("k", 1)[1])): s for g in groups for s in g}
    assert sorted(samples) == sorted(GENERATED)
    for key, s in samples.items():  # the episodes are what the counts below assume
        assert s.metadata["env"]["generated_tokens"] == GENERATED[key] == int(sum(s.loss_mask))
        assert s.response_len == GENERATED[key] + OBSERVED[key]
        assert (s.metadata["generated_len"], s.metadata["budgeted_len"], s.weight) == (GENERATED[key], GENERATED[key], 1.0)
    assert all(specs == [] for specs in engine.specs)  # no gate across turns
    assert (m["duet/budget_tokens"], m["duet/n_min"], m["duet/n_max"]) == (512.0, 2, 2)
    assert m["duet/generated_tokens"] == m["duet/budgeted_tokens"] == m["rollout/generated_tokens"] == 169
    assert m["duet/eps_kept_excess_tokens"] == 0 and m["duet/abort_rate"] == 0.0
    assert m["duet/tokens_over_budget"] == pytest.approx(169 / 512)
    assert manager.method.stats.L("0") == pytest.approx(30.5) and manager.method.stats.L("1") == pytest.approx(54.0)
    assert sorted(manager.method.window.window) == [10, 10, 51, 98]
    assert manager.method.stats.sigma["0"][0] == pytest.approx(1.525)
    manager.update({}, 0)
    _, m1 = manager.rollout(1)
    assert m1["duet/budget_tokens"] == pytest.approx(169.0) and m1["duet/planned_tokens"] <= 169.0
    assert m1["duet/generated_tokens"] == m1["rollout/generated_tokens"]


@pytest.mark.parametrize("name, overrides, message, keys", [
    ("duet.yaml", ["rollout.env=tools"], r"duet.eps_abort is set but rollout.env = 'tools'.*\['duet.eps_abort', "
     r"'duet.grace'\] would change nothing", "configs/duet.yaml"),
    ("duet_tools.yaml", ["duet.trim_entropy=0.5"], r"duet.trim_entropy is set but rollout.env", "duet.trim_entropy=0.5"),
    ("duet_tandem.yaml", ["rollout.env=tools"], r"method duet_tandem with rollout.env = 'tools': its plans carry the "
     r"per-request sampler\(s\) of \['sglang_patches.tandem'\]", "rollout.env=tools"),
])
def test_gate_keys_and_duet_on_tandem_are_rejected_with_an_environment(name, overrides, message, keys):
    with pytest.raises(ConfigError, match=message) as err:
        load_config(CONFIGS / name, overrides)
    assert keys in str(err.value)


def test_the_shipped_config_and_the_single_turn_plan_keep_the_gate():
    from slime_ext.methods.registry import build_method

    cfg = load_config(CONFIGS / "duet_tools.yaml", []).config
    assert (cfg.method, cfg.rollout.env, cfg.duet.budget_fraction) == ("duet", "tools", 0.5)
    prompts = [{"prompt": "q", "label": "1", "row_id": 0}]
    assert build_method(cfg).plan(prompts, 0)[0].sampler_specs == []
    single = build_method(load_config(CONFIGS / "duet.yaml", []).config).plan(prompts, 0)[0].sampler_specs
    assert [s["kind"] for s in single] == ["duet_gate"]
