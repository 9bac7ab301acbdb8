"""DUET and DAPO method hooks on hand-made rollouts (no engine): plans, masks, weights, controller state."""

from __future__ import annotations

import pytest

from slime_ext.config import load_config
from slime_ext.data import Sample
from slime_ext.methods import build_method
from tests.conftest import CONFIGS


def _cfg(name, *overrides):
    return load_config(CONFIGS / name, list(overrides)).config


def _rollout(sid, group, text, n_tokens, notes=None, finish="stop"):
    return Sample(sid, [3], list(range(10, 10 + n_tokens)), group_id=group, label="7", response_text=text,
                  logprobs=[-0.5] * n_tokens, metadata={"annotations": notes or [{}] * n_tokens, "finish_reason": finish})


def test_duet_plan_spends_the_budget_and_carries_the_gate():
    cfg = _cfg("duet.yaml", "duet.budget_fraction=0.5", "rollout.n_samples_per_prompt=8", "rollout.max_response_len=100")
    method = build_method(cfg)
    prompts = [{"prompt": f"q{i}", "label": "1", "row_id": i} for i in range(6)]
    plans = method.plan(prompts, 0)
    n = [p.n for p in plans]
    # cold start: every prompt at the floor s and the default length 50 -> equal counts, B = 0.5 x 8 x 6 x 50
    assert len(set(n)) == 1 and sum(n) * 50 <= 0.5 * 8 * 6 * 50 and sum(n) * 50 >= 0.5 * 8 * 6 * 50 - 6 * 50
    (spec,) = plans[0].sampler_specs
    assert spec["kind"] == "duet_gate" and (spec["k1"], spec["k2"]) == (30, 70) and spec["task"] == "math"


def test_duet_finish_masks_aborted_rollouts_after_the_shared_baseline():
    cfg = _cfg("duet.yaml")
    method = build_method(cfg)
    method.plan([{"prompt": "q", "label": "7", "row_id": 0}, {"prompt": "r", "label": "7", "row_id": 1}], 0)
    abort_note = [{}] * 4 + [{"did_abort": True, "keep_propensity": 0.0}]
    keep_note = [{}] * 4 + [{"did_abort": False, "keep_propensity": 0.05}]
    g1 = [_rollout("a", "g1", "\\boxed{7}", 5), _rollout("b", "g1", "\\boxed{3}", 5),
          _rollout("c", "g1", "xx", 5, abort_note, "sampler")]
    g2 = [_rollout("d", "g2", "\\boxed{7}", 5, keep_note)]
    m = method.finish([g1, g2], 0)
    a, b, c = g1
    # the baseline includes the aborted rollout (rewards 1, 0, 0 -> mean 1/3)
    assert a.advantage > 0 > b.advantage and c.advantage == 0.0 and c.weight == 0.0 and sum(c.loss_mask) == 0
    s_pre = [min(1.0, 3 / 2), max(0.05, 1 / 2)]  # counts 3 and 1, mean 2
    assert a.weight == pytest.approx(1 / s_pre[0]) and g2[0].weight == pytest.approx(1 / (s_pre[1] * 0.05))
    assert m["duet/abort_rate"] == pytest.approx(0.25) and m["duet/mean_is_weight"] > 1
    # controller state: sigma from the two kept rollouts of g1, lengths of kept rollouts
    assert method.stats.sigma["0"][1] == 1 and method.stats.L("0") == 5.0
    state = method.state_dict()
    clone = build_method(cfg)
    clone.load_state_dict(state)
    assert clone.state_dict() == state


def test_dapo_drops_uninformative_groups_and_penalises_overlong():
    cfg = _cfg("dapo.yaml", "rollout.prompts_per_step=2", "rollout.max_response_len=20", "dapo.overlong_buffer=10")
    method = build_method(cfg)
    assert method.prompts_to_draw(2) == 3
    same = [_rollout("a", "g1", "\\boxed{7}", 5), _rollout("b", "g1", "\\boxed{7}", 5)]
    mixed = [_rollout("c", "g2", "\\boxed{7}", 5), _rollout("d", "g2", "\\boxed{1}", 5)]
    long = [_rollout("e", "g3", "\\boxed{7}", 15), _rollout("f", "g3", "\\boxed{7}", 5)]
    m = method.finish([same, mixed, long], 0)
    assert long[0].rewards["overlong"] == pytest.approx(-0.5) and long[0].reward == pytest.approx(0.5)
    assert all(s.weight == 0.0 and sum(s.loss_mask) == 0 for s in same)  # no signal: dropped
    assert all(s.weight == 1.0 for s in mixed + long)
    assert m["dapo/informative_groups"] == 2 and m["dapo/trained_groups"] == 2


def test_dapo_uses_its_own_clip_range():
    from megatron_glue.actor import TrainerSettings

    st = TrainerSettings.from_config(_cfg("dapo.yaml"))
    assert (st.eps_clip_low, st.eps_clip_high) == (0.20, 0.28)
    assert TrainerSettings.from_config(_cfg("grpo.yaml")).eps_clip_high == 0.2
