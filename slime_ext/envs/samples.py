"""What a multi-turn episode adds to its `Sample` beyond a single response's fields."""

from __future__ import annotations

from slime_ext.data import Sample
from slime_ext.envs.rollout import EpisodeResult


def apply_episode(sample: Sample, episode: EpisodeResult) -> Sample:
    """Observation tokens get loss mask 0 (the sample was built from `episode.as_result()`, so its ids, engine
    logprobs, annotations and routing are the episode's already). The response text the verifier reads is the
    last turn's generated text, the model's final answer: observations are the environment's words (a tool
    that prints `\\boxed{}` must not answer for the model). The episode's statistics go to metadata["env"]."""
    if len(episode.loss_mask) != sample.response_len:
        raise ValueError(f"sample {sample.sample_id!r}: the episode has {len(episode.loss_mask)} mask entries for "
                         f"{sample.response_len} response tokens")
    sample.loss_mask = list(episode.loss_mask)
    sample.response_text = episode.final_text
    sample.metadata["env"] = episode.stats()
    sample.validate()
    return sample


def generated_tokens(sample: Sample) -> int:
    """The tokens the policy generated for `sample`: every turn's generated tokens of an episode (its observation
    tokens are the environment's, not generated), else the whole response. What a token budget counts."""
    env = sample.metadata.get("env")
    return int(env["generated_tokens"]) if env is not None else sample.response_len
