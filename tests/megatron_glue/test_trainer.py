"""megatron_glue's train actor in one process: masks, weights, learning signal, exact resume."""

from __future__ import annotations

import random

import pytest
import torch

from megatron_glue.trainer import MegatronTrainer, TrainerSettings
from slime_ext.algo import LossSpec
from megatron_glue.trainer_checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint
from megatron_glue.model_provider import ParallelSizes
from slime_ext.data import Sample
from tests.megatron_fixtures import single_process_parallel_state, tiny_moe_config


@pytest.fixture(scope="module", autouse=True)
def _parallel_state():
    single_process_parallel_state(seed=3)


def make_trainer(**kw) -> MegatronTrainer:
    settings = TrainerSettings(**({"lr": 1e-3, "micro_batch_size": 3, "clip_grad": 0.0} | kw))
    return MegatronTrainer(tiny_moe_config(), settings, ParallelSizes())


def make_samples(n: int = 6, seed: int = 0, min_response: int = 3) -> list[Sample]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        r = rng.randint(min_response, 9)
        out.append(Sample(f"s{i}", [rng.randrange(2, 64) for _ in range(rng.randint(2, 5))],
                          [rng.randrange(2, 64) for _ in range(r)], logprobs=[0.0] * r,
                          advantage=float(rng.choice([-1.0, 1.0])), reward=0.0))
    return out


def grads_of(trainer: MegatronTrainer) -> dict[str, torch.Tensor]:
    return {n: p.main_grad.detach().clone() for n, p in trainer.model.module.named_parameters()}


def test_masked_token_target_does_not_change_loss_or_grads():
    trainer = make_trainer(lr=1e-12)
    samples = make_samples()
    for s in samples:  # the last response token is masked out
        s.loss_mask = [1.0] * (s.response_len - 1) + [0.0]
    first = trainer.train_step(samples, kind="grpo")
    grads_a = grads_of(trainer)
    changed = [Sample(s.sample_id, s.prompt_ids, s.response_ids[:-1] + [(s.response_ids[-1] + 7) % 64],
                      loss_mask=s.loss_mask, logprobs=s.logprobs, advantage=s.advantage) for s in samples]
    second = trainer.train_step(changed, kind="grpo")
    grads_b = grads_of(trainer)
    assert first["pg_loss"] == second["pg_loss"] and first["grad_norm"] == second["grad_norm"]
    assert all(torch.equal(grads_a[n], grads_b[n]) for n in grads_a)
    # control: changing a TRAINED token's target does change them
    trained = [Sample(s.sample_id, s.prompt_ids, [(s.response_ids[0] + 7) % 64] + s.response_ids[1:],
                      loss_mask=s.loss_mask, logprobs=s.logprobs, advantage=s.advantage) for s in samples]
    third = trainer.train_step(trained, kind="grpo")
    assert third["grad_norm"] != pytest.approx(first["grad_norm"], rel=1e-6)


def test_per_sample_weight_scales_the_gradient_exactly():
    trainer = make_trainer(lr=1e-12)
    samples = make_samples()
    norms = {}
    for w in (1.0, 2.5):
        for i, s in enumerate(samples):
            s.weight = w if i == 0 else 0.0
        norms[w] = trainer.train_step(samples, kind="grpo")["grad_norm"]
        assert norms[w] > 0
    assert norms[2.5] == pytest.approx(2.5 * norms[1.0], rel=1e-6)


def test_micro_batch_size_does_not_change_the_step():
    samples = make_samples(7)
    metrics = []
    for mbs, cap in ((1, None), (3, None), (7, None), (7, 20)):  # 20 tokens: 1-3 rows of 7-14 tokens
        single_process_parallel_state(seed=3)
        trainer = make_trainer(micro_batch_size=mbs, max_tokens_per_micro_batch=cap)
        metrics.append(trainer.train_step(samples, kind="grpo"))
    for m in metrics[1:]:
        assert m["pg_loss"] == pytest.approx(metrics[0]["pg_loss"], rel=1e-5)
        assert m["grad_norm"] == pytest.approx(metrics[0]["grad_norm"], rel=1e-5)


def test_grpo_step_raises_logprob_of_positive_advantage_responses():
    single_process_parallel_state(seed=4)
    trainer = make_trainer(lr=3e-3)
    samples = make_samples(8, seed=1)
    before = trainer.compute_logprobs(samples)["logprobs"]
    for i, s in enumerate(samples):
        s.logprobs = before[s.sample_id].tolist()
        s.advantage = 1.0 if i % 2 == 0 else -1.0
    trainer.train_step(samples, kind="grpo")
    after = trainer.compute_logprobs(samples)["logprobs"]
    for i, s in enumerate(samples):
        delta = float(after[s.sample_id].sum() - before[s.sample_id].sum())
        if s.advantage > 0:
            assert delta > 0, (s.sample_id, delta)
    mean_pos = sum(float(after[s.sample_id].mean() - before[s.sample_id].mean()) for s in samples[::2]) / 4
    mean_neg = sum(float(after[s.sample_id].mean() - before[s.sample_id].mean()) for s in samples[1::2]) / 4
    assert mean_pos > mean_neg


def test_sft_lowers_loss_on_fixed_batch():
    single_process_parallel_state(seed=5)
    trainer = make_trainer(lr=3e-3, clip_grad=1.0)
    samples = make_samples(8, seed=2)
    losses = [trainer.train_step(samples, kind="sft")["nll"] for _ in range(15)]
    assert losses[-1] < 0.7 * losses[0], losses


def test_compute_logprobs_matches_a_manual_forward():
    trainer = make_trainer()
    samples = make_samples(3)
    got = trainer.compute_logprobs(samples, with_entropy=True)
    model = trainer.model.module
    model.eval()
    for s in samples:
        ids = torch.tensor([s.prompt_ids + s.response_ids])
        with torch.no_grad():
            logits = model(ids, torch.arange(ids.shape[1])[None], attention_mask=None)[0]
        logp = torch.log_softmax(logits.float(), -1)
        p = len(s.prompt_ids)
        expected = torch.stack([logp[p - 1 + j, tok] for j, tok in enumerate(s.response_ids)])
        assert torch.allclose(got["logprobs"][s.sample_id], expected, atol=1e-5)
        ent = -(logp.exp() * logp).sum(-1)[p - 1 : p - 1 + s.response_len]
        assert torch.allclose(got["entropy"][s.sample_id], ent, atol=1e-5)
    model.train()


def test_reference_snapshot_and_kl_term():
    trainer = make_trainer(lr=1e-2, loss=LossSpec(kl_coef=0.5, kl_estimator="k3"))
    samples = make_samples(4)
    trainer.snapshot_reference()
    ref = trainer.compute_logprobs(samples, reference=True)["logprobs"]
    cur = trainer.compute_logprobs(samples)["logprobs"]
    assert all(torch.equal(ref[k], cur[k]) for k in ref)
    first = trainer.train_step(samples, kind="grpo", ref_logprobs=ref)
    assert first["kl_ref"] == pytest.approx(0.0, abs=1e-7)  # policy == reference before the step
    second = trainer.train_step(samples, kind="grpo", ref_logprobs=ref)
    assert second["kl_ref"] > 1e-6  # the policy moved away; reference stayed
    ref_again = trainer.compute_logprobs(samples, reference=True)["logprobs"]
    assert all(torch.equal(ref[k], ref_again[k]) for k in ref)
    with pytest.raises(ValueError, match="reference logprobs"):
        trainer.train_step(samples, kind="grpo")


def test_a_batch_brings_its_own_loss_spec():
    """An RL batch carries its method's loss spec (which may change during a run): `train_step(loss=...)` is
    the step of a trainer set up with that spec, not of the setup-time `settings.loss`."""
    tight = LossSpec(eps_clip_low=0.01, eps_clip_high=0.01)

    def step(setup: LossSpec, batch: LossSpec | None) -> dict:
        single_process_parallel_state(seed=8)  # the same initial weights for every trainer
        trainer = make_trainer(loss=setup)
        samples = make_samples(6, seed=3)
        current = trainer.compute_logprobs(samples)["logprobs"]
        for i, s in enumerate(samples):  # ratios of exp(+-0.05): inside 1 +- 0.2, outside 1 +- 0.01
            s.logprobs = (current[s.sample_id] + (0.05 if i % 2 else -0.05)).tolist()
        return trainer.train_step(samples, kind="grpo", loss=batch)

    given = step(LossSpec(), tight)
    assert given == step(tight, None)
    setup_time = step(LossSpec(), None)
    assert setup_time["clip_frac"] == 0.0 < given["clip_frac"] and setup_time["pg_loss"] != given["pg_loss"]


def test_checkpoint_resume_is_exact(tmp_path):
    settings = dict(lr=1e-3, lr_warmup_steps=2, total_steps=10, lr_decay_style="cosine")
    trainer = make_trainer(**settings)
    samples = make_samples(6)
    for _ in range(2):
        trainer.train_step(samples, kind="sft")
    save_checkpoint(trainer, tmp_path, extra={"data_offset": 12})
    assert latest_checkpoint(tmp_path).name == "iter_0000002"
    continued = [trainer.train_step(samples, kind="sft")["nll"] for _ in range(3)]
    final = trainer.local_state_dict()
    resumed = make_trainer(**settings)
    assert load_checkpoint(resumed, tmp_path) == {"data_offset": 12}
    again = [resumed.train_step(samples, kind="sft")["nll"] for _ in range(3)]
    assert again == continued
    assert all(torch.equal(final[k], v) for k, v in resumed.local_state_dict().items())


def test_missing_checkpoint_and_bad_batch_errors(tmp_path):
    trainer = make_trainer()
    with pytest.raises(FileNotFoundError, match="no complete checkpoint"):
        load_checkpoint(trainer, tmp_path)
    samples = make_samples(2)
    samples[1].advantage = None
    with pytest.raises(ValueError, match="advantage on every sample; missing on \\['s1'\\]"):
        trainer.train_step(samples, kind="grpo")


def test_sft_on_the_synthetic_task_lowers_heldout_loss(tmp_path):
    """Real data path: synthetic L2 problems, the locally trained tokenizer, prompt masked out."""
    from megatron_glue.hf_config import round_up
    from slime_ext.tasks.synthetic_math import generate_dataset
    from slime_ext.tasks.templates import get_template
    from slime_ext.tokenizer import build_embedded_tokenizer, load_tokenizer
    from tests.megatron_fixtures import tiny_moe_config

    single_process_parallel_state(seed=6)
    rows = generate_dataset("L2", 72, seed=0, split="train")
    tok = load_tokenizer(build_embedded_tokenizer(tmp_path, [r["prompt"] + "\n" + r["solution"] for r in rows], 320))
    template = get_template("plain")

    def as_sample(i, r):
        prompt = tok(template.format(r["prompt"]))["input_ids"]
        response = tok(r["solution"])["input_ids"] + [tok.eos_token_id]
        return Sample(f"r{i}", prompt, response)

    train = [as_sample(i, r) for i, r in enumerate(rows[:64])]
    held = [as_sample(i, r) for i, r in enumerate(rows[64:])]
    trainer = MegatronTrainer(tiny_moe_config(vocab_size=round_up(len(tok), 64), hidden_size=64),
                              TrainerSettings(lr=3e-3, micro_batch_size=16, clip_grad=1.0), ParallelSizes(),
                              pad_id=tok.pad_token_id)

    def heldout_nll():
        lps = trainer.compute_logprobs(held)["logprobs"]
        return -float(torch.cat(list(lps.values())).mean())

    before = heldout_nll()
    for _ in range(25):
        trainer.train_step(train, kind="sft")
    after = heldout_nll()
    assert before > 5.0  # ~ln(vocab) at initialisation
    assert after < 0.5 * before, (before, after)


def test_optimizer_cpu_offload_reaches_megatron_on_gpus_only():
    import torch as _torch

    from megatron_glue.trainer import optimizer_config

    on = TrainerSettings(optimizer_cpu_offload=True)
    gpu = optimizer_config(on, _torch.bfloat16, cuda=True)
    assert gpu.optimizer_cpu_offload and gpu.optimizer_offload_fraction == 1.0 and gpu.overlap_cpu_optimizer_d2h_h2d
    cpu = optimizer_config(on, _torch.float32, cuda=False)
    assert not cpu.optimizer_cpu_offload and cpu.optimizer_offload_fraction == 0.0
    assert not optimizer_config(TrainerSettings(), _torch.bfloat16, cuda=True).optimizer_cpu_offload


def test_micro_batches_group_samples_by_length_and_keep_every_sample():
    trainer = make_trainer(micro_batch_size=2)
    lengths = [10, 100, 12, 98, 11, 99]
    samples = [Sample(f"s{i}", [3] * 4, [5] * (n - 4)) for i, n in enumerate(lengths)]
    micro = trainer._micro_batches(samples)
    widths = [mb["tokens"].shape[1] for mb in micro]
    assert widths == [11, 98, 100]  # sorted: (10, 11), (12, 98), (99, 100); unsorted would pad to 100, 98, 99
    assert sorted(i for mb in micro for i in mb["batch"].sample_ids) == sorted(s.sample_id for s in samples)


def test_micro_batches_hold_at_most_max_tokens_padded():
    """train.parallel.max_tokens_per_gpu: rows x longest row <= the cap, besides micro_batch_size rows; a sample
    longer than the cap trains alone."""
    trainer = make_trainer(micro_batch_size=4, max_tokens_per_micro_batch=200)
    lengths = [10, 100, 12, 98, 11, 99, 250]
    samples = [Sample(f"s{i}", [3] * 4, [5] * (n - 4)) for i, n in enumerate(lengths)]
    micro = trainer._micro_batches(samples)
    shapes = [tuple(mb["tokens"].shape) for mb in micro]
    # sorted 10 11 12 | 98 99 (3 x 100 > 200) | 100 | 250 (alone, over the cap)
    assert shapes == [(3, 12), (2, 99), (1, 100), (1, 250)]


def test_a_samples_per_token_advantages_add_to_its_advantage_on_the_loss_input():
    """Sample.token_advantages (a method's dense term, e.g. on-policy distillation): the trainer's loss reads
    advantage + token term at each response token, logit-aligned (position t describes token t + 1), and the
    sample's advantage alone where the term is absent."""
    trainer = make_trainer(micro_batch_size=4)
    dense = Sample("dense", [3, 4], [5, 6, 7], advantage=0.5, token_advantages=[0.25, -1.0, 2.0])
    plain = Sample("plain", [3, 4, 8], [5, 6], advantage=-0.5)
    (mb,) = trainer._micro_batches([dense, plain])
    rows = {sid: i for i, sid in enumerate(mb["batch"].sample_ids)}
    got = mb["advantages"] * mb["loss_mask"]  # what the loss multiplies (prompt positions carry no loss)
    # dense: tokens at positions 2, 3, 4 -> logit positions 1, 2, 3
    assert got[rows["dense"]].tolist() == [0.0, 0.75, -0.5, 2.5, 0.0]
    assert got[rows["plain"]].tolist() == [0.0, 0.0, -0.5, -0.5, 0.0]
    with pytest.raises(ValueError, match="token_advantages has 2 entries but response_ids has 3 tokens"):
        Sample("bad", [3], [5, 6, 7], token_advantages=[0.0, 1.0])
    with pytest.raises(ValueError, match="token_advantages must be finite"):
        Sample("nan", [3], [5], token_advantages=[float("nan")])
