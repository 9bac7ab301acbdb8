"""On-policy distillation (`method: opd`): the advantage by hand for a scripted teacher and student up to the
trainer's loss input, the teacher scoring the exact sampled ids (observations of a tool episode included as
context, never scored), the engine's prefill-only scoring against its own sampling logprobs, and the config."""

from __future__ import annotations

import copy

import pytest
import torch

from slime_ext.config import ConfigError, load_config
from slime_ext.config.__main__ import main as config_main
from slime_ext.data import Sample
from slime_ext.envs import registry as envs
from slime_ext.methods.opd.method import SCORED_KEY, distillation_advantages, teacher_dir
from slime_ext.orchestration.local_endpoints import build_run_method
from slime_ext.orchestration.rollout_manager import RolloutManager
from tests.conftest import CONFIGS
from tests.envs.conftest import RecordingEngine, embedded_engine, model_dir, tokenizer  # noqa: F401 - fixtures
from tests.megatron_fixtures import single_process_parallel_state
from tests.megatron_glue.test_trainer import make_trainer

OPD = CONFIGS / "opd.yaml"


def opd_config(*overrides: str):
    base = ["rollout.manager=driver", "rollout.prompts_per_step=2", "rollout.n_samples_per_prompt=2",
            "rollout.max_response_len=48"]
    return load_config(OPD, base + list(overrides)).config


def scripted_group() -> list[Sample]:
    right = Sample("s0-p0-k0", [3, 4], [5, 6, 7], group_id="s0-p0", logprobs=[-1.0, -2.0, -0.5],
                   loss_mask=[1.0, 1.0, 0.0], response_text="so \\boxed{7}", label="7")
    wrong = Sample("s0-p0-k1", [3, 4], [8, 9], group_id="s0-p0", logprobs=[-0.3, -0.7],
                   response_text="so \\boxed{8}", label="7")
    right.metadata[SCORED_KEY] = [-0.5, -2.5, -9.0]
    wrong.metadata[SCORED_KEY] = [-0.1, -1.7]
    return [right, wrong]


def test_the_advantage_by_hand_reaches_the_trainers_loss_input():
    cfg = opd_config("opd.kl_coef=0.5", "opd.reward_weight=0.25")
    group = scripted_group()
    reference = copy.deepcopy(group)
    build_run_method(load_config(CONFIGS / "grpo.yaml").config).finish([reference], 0)  # the task reward's GRPO
    metrics = build_run_method(cfg).finish([group], 0)
    right, wrong = group
    # 0.5 x (teacher - student) per trained token; the masked third token of `right` gets nothing
    assert right.token_advantages == [0.25, -0.25, 0.0] and wrong.token_advantages == pytest.approx([0.1, -0.5])
    grpo = [s.advantage for s in reference]
    assert grpo[0] > 0 > grpo[1]  # the right answer's reward is above the group's
    assert [s.advantage for s in group] == pytest.approx([0.25 * a for a in grpo])
    # reverse KL (student - teacher) over the 4 trained tokens: (-0.5 + 0.5 - 0.2 + 1.0) / 4
    assert metrics["opd/reverse_kl"] == pytest.approx(0.2) and metrics["opd/scored_tokens"] == 4.0
    assert all(SCORED_KEY not in s.metadata for s in group)
    single_process_parallel_state(seed=3)
    (mb,) = make_trainer(micro_batch_size=4)._micro_batches(group)
    rows = {sid: i for i, sid in enumerate(mb["batch"].sample_ids)}
    got = (mb["advantages"] * mb["loss_mask"]).tolist()
    a0, a1 = 0.25 * grpo[0], 0.25 * grpo[1]
    # logit-aligned: response tokens at positions 2, 3, 4 are read at 1, 2, 3
    assert got[rows["s0-p0-k0"]] == pytest.approx([0.0, a0 + 0.25, a0 - 0.25, 0.0, 0.0])
    assert got[rows["s0-p0-k1"]] == pytest.approx([0.0, a1 + 0.1, a1 - 0.5, 0.0, 0.0])


def test_pure_distillation_ignores_the_reward_and_a_missing_score_is_an_error():
    group = scripted_group()
    build_run_method(opd_config()).finish([group], 0)
    assert [s.advantage for s in group] == [0.0, 0.0]
    unscored = scripted_group()
    del unscored[1].metadata[SCORED_KEY]
    with pytest.raises(ValueError, match="sample 's0-p0-k1' has no teacher logprob per response token"):
        build_run_method(opd_config()).finish([unscored], 0)
    assert distillation_advantages([0.0, -1.0], [-1.0, -1.0], [1.0, 0.5], 2.0) == [2.0, 0.0]


class ScoringEngine(RecordingEngine):
    """The envs' recording engine with a teacher whose logprob of token id t is -t / 100, recording every
    scoring call's sequences and starts."""

    def __init__(self, engine):
        super().__init__(engine)
        self.scored: list[tuple[list[int], int, str]] = []

    def score(self, sequences, starts, model):
        self.scored += [(list(seq), start, model) for seq, start in zip(sequences, starts)]
        return [[-t / 100 for t in seq[start:]] for seq, start in zip(sequences, starts)]


def test_the_teacher_scores_the_exact_sampled_ids_and_observations_are_never_scored(monkeypatch, model_dir,
                                                                                     tokenizer):
    monkeypatch.setitem(envs.ENVS, "scripted", envs.EnvEntry("tests.envs.conftest:ScriptedEnv"))
    cfg = opd_config("rollout.env=scripted", "rollout.max_turns=3", "rollout.max_turn_tokens=10",
                     "opd.kl_coef=2.0")
    rows = [{"prompt": f"what is {i} + 34?", "label": str(i + 34), "row_id": i, "level": "L0"} for i in range(4)]
    engine = ScoringEngine(embedded_engine(model_dir))
    groups, metrics = RolloutManager(cfg, rows, tokenizer, engine).rollout(0)
    samples = [s for g in groups for s in g]
    assert len(engine.scored) == len(samples) == 4
    observed = 0
    for s, (seq, start, model) in zip(samples, engine.scored):
        assert seq == s.prompt_ids + s.response_ids and start == len(s.prompt_ids) and model == "partner"
        for tok, lp, m, adv in zip(s.response_ids, s.logprobs, s.loss_mask, s.token_advantages):
            if m == 0:  # an observation token: context for both models, no term
                assert adv == 0.0
                observed += 1
            else:
                assert adv == pytest.approx(2.0 * (-tok / 100 - lp))
    assert observed > 0  # the episodes did hold observations
    assert metrics["opd/scored_tokens"] == sum(sum(1 for m in s.loss_mask if m > 0) for s in samples)


def test_the_engine_scores_at_temperature_1_what_it_samples(model_dir):
    """Prefill-only scoring of a generated sequence under the policy equals the logprobs the engine reported
    while sampling it at temperature 1; an engine without a partner refuses to score with one."""
    from sglang_patches.decoding import SamplingParams
    from slime_ext.data.generation import GenerateRequest

    engine = embedded_engine(model_dir)
    prompt = [5, 6, 7, 8]
    (res,) = engine.generate([GenerateRequest("r", prompt, SamplingParams(temperature=1.0, max_new_tokens=12), 3)])
    (scored,) = engine.score([prompt + res.output_ids], [len(prompt)], "policy")
    assert len(scored) == len(res.output_ids) == 12
    assert torch.allclose(torch.tensor(scored), torch.tensor(res.logprobs), atol=1e-4)
    with pytest.raises(ValueError, match="model 'partner' is not held by this engine"):
        engine.score([prompt + res.output_ids], [len(prompt)], "partner")


def test_padded_batches_score_each_sequence_as_alone(model_dir, monkeypatch):
    """Scoring sorts sequences by length into right-padded batches (causal attention and per-token routing leave
    real positions alone): each sequence's logprobs equal scoring it by itself, in the order given, across
    batches of 2 and with starts anywhere in the sequence."""
    from slime_ext.engine import embedded

    engine = embedded_engine(model_dir)
    torch.manual_seed(1)
    sequences = [torch.randint(3, 300, (n,)).tolist() for n in (9, 4, 15, 7, 12)]
    starts = [3, 1, 10, 6, 2]
    alone = [engine.score([seq], [start], "policy")[0] for seq, start in zip(sequences, starts)]
    monkeypatch.setattr(embedded, "SCORE_BATCH", 2)
    together = engine.score(sequences, starts, "policy")
    assert [len(x) for x in together] == [len(s) - st for s, st in zip(sequences, starts)]
    for a, b in zip(alone, together):
        assert torch.allclose(torch.tensor(a), torch.tensor(b), atol=1e-5)
    with pytest.raises(ValueError, match="start 0 outside 1..4"):
        engine.score([sequences[1]], [0], "policy")


def test_config_check_and_teacher_paths(tmp_path, capsys):
    assert config_main(["--check", str(OPD)]) == 0
    assert config_main(["--check", str(OPD), "rollout.engine=sglang"]) == 0  # a teacher server of its own
    assert config_main(["--check", str(OPD), "opd.teacher_tp_size=2"]) == 2  # a server key on the embedded path
    assert "opd.teacher_tp_size = 2 applies to the teacher's engine servers" in capsys.readouterr().err
    with pytest.raises(ConfigError, match="opd.kl_coef"):
        load_config(OPD, ["opd.kl_coef=0"])
    with pytest.raises(ConfigError, match="opd.teacher is empty: name the teacher's HF checkpoint"):
        load_config(OPD, ["opd.teacher="])
    run = tmp_path / "run"
    (run / "hf").mkdir(parents=True)
    (run / "hf" / "config.json").write_text("{}")
    assert teacher_dir(str(run)) == str(run / "hf") and teacher_dir(str(run / "hf")) == str(run / "hf")


def test_check_refuses_a_teacher_whose_tokenizer_is_not_the_students(model_dir, tmp_path, capsys):
    """`--check` compares the vocabularies where both tokenizers are on the machine (`tokenizer.path` a folder):
    a teacher that would read the student's ids as other tokens is refused before anything starts."""
    from slime_ext.tokenizer import train_tokenizer

    other = tmp_path / "other_tokenizer"
    train_tokenizer(["a different corpus of words", "with other merges and other words"] * 50, vocab_size=300,
                    out_dir=other)
    assert config_main(["--check", str(OPD), f"opd.teacher={model_dir}", f"tokenizer.path={model_dir}"]) == 0
    capsys.readouterr()
    assert config_main(["--check", str(OPD), f"opd.teacher={model_dir}", f"tokenizer.path={other}"]) == 2
    err = capsys.readouterr().err
    assert f"opd.teacher = {model_dir}: its tokenizer is not the student's ({other})" in err
    assert "vocabularies differ" in err
