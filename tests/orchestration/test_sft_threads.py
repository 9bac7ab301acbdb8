"""SFT's threads per trainer rank: the engine's threads join the trainer's, split over the ranks."""

import pytest

from slime_ext.config.schema import Config
from slime_ext.orchestration.training_job import sft_threads_per_rank


@pytest.mark.parametrize("train, rollout, ranks, expected", [
    (1, 1, 1, 2),  # one rank takes both cores
    (1, 1, 2, 1),  # local-cpu.yaml: two ranks of one thread, not two of two on 2 cores
    (3, 1, 2, 2),
    (1, 1, 4, 1),  # never zero threads
])
def test_sft_threads_are_split_over_the_ranks(train, rollout, ranks, expected):
    cfg = Config(train={"threads": train}, rollout={"threads": rollout})
    assert sft_threads_per_rank(cfg, ranks) == expected
