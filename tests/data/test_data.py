"""The rollout data model: validation, and every per-token value on its token in the padded batch."""

from __future__ import annotations

import random

import pytest
import torch

from slime_ext.data import Author, Sample, SampleStatus, SampleValidationError, build_batch


def make_sample(i: int, p: int, r: int, **kw) -> Sample:
    rng = random.Random(i)
    return Sample(
        sample_id=f"s{i}",
        prompt_ids=[rng.randrange(10, 300) for _ in range(p)],
        response_ids=[rng.randrange(10, 300) for _ in range(r)],
        group_id=f"g{i // 2}",
        author=[rng.choice([0, 1]) for _ in range(r)],
        channel=[rng.choice([0, 1]) for _ in range(r)],
        logprobs=[-rng.random() for _ in range(r)],
        loss_mask=[rng.choice([0.0, 1.0]) for _ in range(r)],
        reward=float(i % 2),
        advantage=float(i) - 1.5,
        weight=1.0 + i,
        cost=float(i % 3 == 0),
        **kw,
    )


def test_mismatched_lengths_name_the_sample_and_field():
    with pytest.raises(SampleValidationError, match=r"sample 'bad-7': loss_mask has 2 entries but response_ids has 3"):
        Sample("bad-7", [1, 2], [3, 4, 5], loss_mask=[1, 1])
    with pytest.raises(SampleValidationError, match=r"sample 'x': author has 1 entries"):
        Sample("x", [1], [3, 4], author=[1])
    with pytest.raises(SampleValidationError, match=r"sample 'x': logprobs has 3 entries"):
        Sample("x", [1], [3, 4], logprobs=[0.0, 0.0, 0.0])
    with pytest.raises(SampleValidationError, match="empty prompt_ids"):
        Sample("x", [], [3])
    with pytest.raises(SampleValidationError, match="status 'done' is not one of"):
        Sample("x", [1], [2], status="done")
    with pytest.raises(SampleValidationError, match="author values"):
        Sample("x", [1], [2], author=[5])
    # mutation after construction is caught when the batch is built
    s = Sample("late", [1], [2, 3])
    s.channel = [1]
    with pytest.raises(SampleValidationError, match="sample 'late': channel has 1 entries"):
        build_batch([s], pad_id=0)


def test_defaults_and_round_trip():
    s = Sample("a", [1, 2], [3, 4, 5], status="truncated")
    assert s.loss_mask == [1.0, 1.0, 1.0] and s.status is SampleStatus.TRUNCATED
    again = Sample.from_dict(s.to_dict())
    assert again == s
    assert Author.POLICY == 1 and Author.PARTNER == 0


def test_every_annotation_stays_on_its_token():
    samples = [make_sample(i, p, r) for i, (p, r) in enumerate([(3, 5), (7, 1), (2, 9), (4, 4)])]
    groups = [samples[:2], samples[2:]]
    batch = build_batch(groups, pad_id=0, pad_to_multiple_of=4)
    assert batch.tokens.shape[-1] % 4 == 0
    response = torch.zeros(batch.tokens.shape, dtype=torch.bool)
    for i, s in enumerate(samples):
        # the response span as the trainer cuts it (prompt_lens / response_lens, megatron_glue/trainer.py)
        start, n = int(batch.prompt_lens[i]), int(batch.response_lens[i])
        assert (start, n) == (len(s.prompt_ids), len(s.response_ids))
        response[i, start : start + n] = True
        assert batch.tokens[i, start : start + n].tolist() == s.response_ids
        assert torch.equal(batch.loss_mask[i, start : start + n], torch.tensor(s.loss_mask))
        assert torch.equal(batch.old_logprobs[i, start : start + n], torch.tensor(s.logprobs))
        # every token's id and position match the sample it belongs to
        where = batch.seq_index == i
        assert batch.tokens[where].tolist() == s.prompt_ids + s.response_ids
        assert batch.position_ids[where].tolist() == list(range(s.total_len))
    # prompt and padding positions are never trained and carry no logprob
    assert batch.loss_mask[~response].abs().sum() == 0 and batch.old_logprobs[~response].abs().sum() == 0
    assert int(batch.attention_mask.sum()) == sum(s.total_len for s in samples)
    # per-sample values broadcast onto the right tokens
    adv_tok = batch.per_token(batch.advantages)
    for i, s in enumerate(samples):
        assert torch.all(adv_tok[batch.seq_index == i] == s.advantage)
    assert torch.all(adv_tok[batch.seq_index < 0] == 0)
    assert batch.weights.tolist() == [1.0, 2.0, 3.0, 4.0]


def test_padded_layout_fields():
    samples = [make_sample(0, 2, 3), make_sample(1, 1, 1)]
    padded = build_batch(samples, pad_id=7)
    assert padded.tokens.shape == (2, 5)
    assert padded.attention_mask.tolist() == [[True] * 5, [True, True, False, False, False]]
    assert padded.tokens[1, 2:].tolist() == [7, 7, 7]
    assert build_batch(samples, pad_id=7, pad_to_multiple_of=8).tokens.shape == (2, 8)


def test_a_batch_refuses_repeated_ids_and_zero_samples():
    a = make_sample(0, 2, 2)
    with pytest.raises(SampleValidationError, match="appears twice"):
        build_batch([a, a], pad_id=0)
    with pytest.raises(ValueError, match="zero samples"):
        build_batch([], pad_id=0)
