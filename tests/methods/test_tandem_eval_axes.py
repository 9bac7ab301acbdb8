"""Tandem's evaluation axes: handoff schedules over two engines, drift and legibility numbers."""

from __future__ import annotations

import math

import pytest
import torch

from slime_ext.engine.embedded import EmbeddedEngine
from slime_ext.methods.tandem.eval_axes import legibility, team_rollouts, token_drift
from tests.megatron_fixtures import tiny_tandem_model

EOS = 1


@pytest.fixture(scope="module")
def models():
    torch.set_num_threads(1)
    return tiny_tandem_model(0), tiny_tandem_model(1)


@pytest.fixture(scope="module")
def step_token(models):
    """The separator: the token both models emit most often, so team rollouts have several steps."""
    from collections import Counter

    from slime_ext.methods.tandem.eval_axes import solo_outputs

    counts = Counter()
    for m in models:
        for o in solo_outputs(EmbeddedEngine(m, EOS), [[5, 6], [10, 11, 12]], 4, 30):
            counts.update(t for t in o if t != EOS)
    return counts.most_common(1)[0][0]


def engines(models, step):
    decode = lambda ids: "".join("\n\n" if t == step else "x" for t in ids)  # noqa: E731
    senior, junior = models
    return EmbeddedEngine(senior, EOS, decode=decode), EmbeddedEngine(junior, EOS, decode=decode)


def test_alternate_schedule_alternates_steps_and_reuses_prefixes(models, step_token):
    s_eng, j_eng = engines(models, step_token)
    prompts = [[5, 6, 8, 9], [10, 11]]
    rollouts, cache = team_rollouts(s_eng, j_eng, prompts, n_samples=3, schedule="alternate",
                                    max_new_tokens=60, eos_token_id=EOS, seed=0)
    assert len(rollouts) == 6
    multi = 0
    for r in rollouts:
        assert r.turn_authors == ["senior", "junior"] * (r.turns // 2) + ["senior"] * (r.turns % 2)
        assert r.senior_tokens + r.junior_tokens == len(r.output_ids)
        # every turn but the last ends right after a step separator
        assert r.output_ids.count(step_token) >= r.turns - 1
        multi += r.turns > 1
    assert multi >= 3
    # Each turn re-feeds prompt + response so far; with prefix reuse an engine computes only what it has
    # not seen: the other engine's last step plus its own last token (never fed). Bound that exactly.
    bound = 0
    for r in rollouts:
        prompt = len(prompts[r.prompt_index])
        bound += prompt + (prompt + r.turn_lengths[0] if r.turns > 1 else 0)
        bound += sum(r.turn_lengths[t - 1] + 1 for t in range(2, r.turns))
    computed = cache["fed_tokens"] - cache["cached_tokens"]
    assert computed <= bound < cache["fed_tokens"]
    assert cache["cached_token_share"] > 0.2


def test_bernoulli_schedule_is_seeded(models, step_token):
    s_eng, j_eng = engines(models, step_token)
    prompts = [[5, 6, 8, 9], [10, 11], [12]]
    heard: list[str] = []
    a, _ = team_rollouts(s_eng, j_eng, prompts, 4, "bernoulli", 60, EOS, seed=3, progress=heard.append)
    b, _ = team_rollouts(s_eng, j_eng, prompts, 4, "bernoulli", 60, EOS, seed=3)
    assert [r.output_ids for r in a] == [r.output_ids for r in b]
    # one progress line per turn, counting the rollouts still writing and whose turn each one is
    expected = []
    for t in range(max(r.turns for r in a)):
        authors = [r.turn_authors[t] for r in a if r.turns > t]
        expected.append(f"turn {t}: {len(authors)} of 12 rollouts unfinished "
                        f"({authors.count('senior')} senior, {authors.count('junior')} junior)")
    assert heard == expected
    patterns = {tuple(r.turn_authors[:2]) for r in a if r.turns >= 2}
    assert len(patterns) >= 2  # not a fixed order
    with pytest.raises(ValueError, match="unknown handoff schedule"):
        team_rollouts(s_eng, j_eng, prompts, 1, "random", 10, EOS)


def test_token_drift_matches_a_hand_computation():
    d = token_drift([[1, 1, 2]], [[1, 2, 2]], vocab_size=3, min_junior_count=1, smoothing=0.5)
    assert d["kl_senior_junior"] == pytest.approx(math.log(5 / 3) / 4.5, rel=1e-9)
    # junior-frequent tokens 1 and 2 both have |log ratio| = log(5/3) = 0.51
    assert d["survival"][d["survival_thresholds"].index(0.5)] == 1.0
    assert d["survival"][d["survival_thresholds"].index(1.0)] == 0.0
    same = token_drift([[1, 2, 2]], [[2, 1, 2]], vocab_size=3, min_junior_count=1)
    assert same["kl_senior_junior"] == 0.0 and same["survival"][1] == 0.0


def test_legibility_of_a_model_under_itself_and_a_manual_cross_entropy(models):
    senior, junior = models
    prompts, outputs = [[5, 6], [8, 9, 10]], [[11, 12, 13], [14, 15]]
    own = legibility(senior, senior, prompts, outputs)
    assert own["overlap"] == pytest.approx(1.0, abs=1e-5)
    cross = legibility(senior, junior, prompts, outputs)
    manual, n = 0.0, 0
    with torch.no_grad():
        for p, o in zip(prompts, outputs):
            lp = torch.log_softmax(junior(torch.tensor([p + o])).logits[0], -1)
            manual += sum(-float(lp[len(p) - 1 + i, t]) for i, t in enumerate(o))
            n += len(o)
    assert cross["junior_ce_on_senior"] == pytest.approx(manual / n, rel=1e-4)
    assert 0.0 < cross["overlap"] < 0.99


# -- which runs evaluate the axes: the `tandem_axes` section of the run's config ------------------------------------
def test_the_axes_follow_the_runs_tandem_axes_section(monkeypatch, tmp_path, capsys):
    from types import SimpleNamespace

    from slime_ext.config import load_config
    from slime_ext.methods.tandem import eval_axes
    from tests.conftest import CONFIGS

    asked: list[int] = []

    def fake_axes(senior, junior, tokenizer, rows, cfg, n_prompts, load_engine, progress=None):
        asked.append(n_prompts)
        part = {"pass@1": 0.5, "mean_correct": 0.5, "senior_share_mean": 0.5, "cached_token_share": 0.0}
        return {"handoff_alternate": part, "handoff_bernoulli": part, "legibility": {"junior_ce_on_senior": 1.0,
                "overlap": 0.5}, "drift": {"kl_senior_junior": 0.1, "survival_thresholds": [0.2], "survival": [0.3]}}

    monkeypatch.setattr(eval_axes, "tandem_axes", fake_axes)
    monkeypatch.setattr(eval_axes, "survival_plot", lambda drift, path: None)

    def method(config):
        return SimpleNamespace(config=config, tokenizer=None, name="m", partner_dir=lambda d: None,
                               kl_reference_dir=lambda d: None)

    run = lambda config: eval_axes.final_evaluation(method(config), tmp_path, tmp_path, tmp_path, [], print)  # noqa: E731
    run(load_config(CONFIGS / "grpo.yaml").config)  # off by default
    run(SimpleNamespace())  # a method whose entry declares no such section
    assert asked == [] and not (tmp_path / "tandem_axes.json").exists()
    run(load_config(CONFIGS / "tandem_grpo.yaml", ["tandem_axes.prompts=7"]).config)  # a plain GRPO run with the axes
    assert asked == [7] and (tmp_path / "tandem_axes.json").is_file()

    # eval_checkpoint --tandem-junior: the checkpoint's run config, its prompts or the section's default
    eval_axes.checkpoint_evaluation(tmp_path, "J", None, [], load_config(CONFIGS / "tandem.yaml", [
        "tandem_axes.prompts=5"]).config, tmp_path / "eval.json", print)
    eval_axes.checkpoint_evaluation(tmp_path, "J", None, [], SimpleNamespace(), tmp_path / "eval.json", print)
    assert asked == [7, 5, 256] and (tmp_path / "eval_tandem_axes.json").is_file()
    assert "drift_kl: 0.1000" in capsys.readouterr().out


# -- where a turn ends, team rollouts per prompt, the drift floor (task v2's line-per-step format) ---------------
def test_a_turn_ends_at_the_given_step_separator(models, step_token):
    """On task v2 a step is a line: with the separator "\\n" the team hands over at every step token; asked to end
    turns at "\\n\\n", which that text never holds, each rollout is one senior turn."""
    senior, junior = models
    decode = lambda ids: "".join("\n" if t == step_token else "x" for t in ids)  # noqa: E731
    s_eng, j_eng = EmbeddedEngine(senior, EOS, decode=decode), EmbeddedEngine(junior, EOS, decode=decode)
    prompts = [[5, 6, 8, 9], [10, 11]]
    lines, _ = team_rollouts(s_eng, j_eng, prompts, 3, "alternate", 60, EOS, seed=0, step_end="\n")
    assert sum(r.turns > 1 for r in lines) >= 3
    assert all(r.output_ids.count(step_token) >= r.turns - 1 for r in lines)
    paragraphs, _ = team_rollouts(s_eng, j_eng, prompts, 3, "alternate", 60, EOS, seed=0)  # default "\n\n"
    assert all(r.turns == 1 and r.junior_tokens == 0 for r in paragraphs)


def test_axes_settings_default_to_the_evaluation_and_refuse_k_above_the_team_rollouts():
    from slime_ext.config import load_config
    from slime_ext.methods.tandem.eval_axes import axes_settings, step_separator
    from tests.conftest import CONFIGS

    cfg = load_config(CONFIGS / "tandem.yaml").config
    settings = axes_settings(cfg)
    assert (settings.samples(cfg), settings.ks(cfg)) == (4, [1, 4]) and step_separator(cfg) == "\n\n"
    cfg = load_config(CONFIGS / "tandem.yaml", ["tandem_axes.n_samples=8", "tandem_axes.k=[1,4,8]"]).config
    assert (cfg.tandem_axes.samples(cfg), cfg.tandem_axes.ks(cfg)) == (8, [1, 4, 8])
    with pytest.raises(ValueError, match=r"tandem_axes.k = \[1, 8\] asks pass@8 from 4 team rollouts"):
        load_config(CONFIGS / "tandem.yaml", ["tandem_axes.k=[1,8]"])
    with pytest.raises(ValueError, match="tandem_axes.k"):
        load_config(CONFIGS / "tandem.yaml", ["tandem_axes.k=[0]"])
    assert step_separator(load_config(CONFIGS / "grpo_v2.yaml").config) == "\n"


def test_the_axes_pair_per_prompt_counts_and_measure_the_junior_against_itself(models, step_token):
    """`tandem_axes` end to end on two tiny models: the handoff report keeps each prompt's correct count (their
    sum is the mean), and the drift floor is the junior's own generations under other seeds, above zero and
    equal to token_drift of those generations."""
    from types import SimpleNamespace

    from slime_ext.methods.tandem import eval_axes

    senior, junior = models
    vocab = senior.config.vocab_size

    class Tokenizer:
        eos_token_id = EOS

        def __call__(self, text):
            return {"input_ids": [5 + (ord(c) % 20) for c in text]}

        def decode(self, ids, skip_special_tokens=True):
            return "".join("\n" if t == step_token else chr(48 + t % 10) for t in ids)

        def __len__(self):
            return vocab

    engines = {"S": senior, "J": junior}
    load = lambda d: EmbeddedEngine(engines[d], EOS, decode=Tokenizer().decode)  # noqa: E731
    rows = [{"prompt": p, "label": "7"} for p in ("ab", "cde", "f")]
    cfg = SimpleNamespace(eval=SimpleNamespace(n_samples=4, k=[1, 4]), rollout=SimpleNamespace(max_response_len=24),
                          data=SimpleNamespace(template="plain", synthetic=SimpleNamespace(step_separator="\n")),
                          reward=SimpleNamespace(type="math"), run=SimpleNamespace(seed=0),
                          tandem_axes=SimpleNamespace(samples=lambda c: 4, ks=lambda c: [1, 4]))
    axes = eval_axes.tandem_axes("S", "J", Tokenizer(), rows, cfg, n_prompts=3, load_engine=load)
    for schedule in ("alternate", "bernoulli"):
        h = axes[f"handoff_{schedule}"]
        assert len(h["correct_per_prompt"]) == 3 and sum(h["correct_per_prompt"]) == pytest.approx(12 * h["mean_correct"])
    assert axes["step_end"] == "\n"
    from slime_ext.tasks.templates import get_template

    prompts = [Tokenizer()(get_template("plain").format(r["prompt"]))["input_ids"] for r in rows]
    j_out = eval_axes.solo_outputs(load("J"), prompts, 2, 24, seed=0, tag="j")
    j_again = eval_axes.solo_outputs(load("J"), prompts, 2, 24, seed=1_000_003, tag="jj")
    assert j_again != j_out
    floor = eval_axes.token_drift(j_again, j_out, vocab_size=vocab)
    assert axes["drift_floor"]["kl_senior_junior"] == pytest.approx(floor["kl_senior_junior"], rel=1e-12)
    assert 0 < floor["kl_senior_junior"]
    assert eval_axes.axes_row(axes)["drift_kl_floor"] == axes["drift_floor"]["kl_senior_junior"]
