"""Shared pieces of the environment tests: a trained tokenizer with a tiny random MoE saved beside it, a
scripted environment, and an engine wrapper that records every generate call."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from slime_ext.envs.base import EnvStep, Environment

TEXTS = [
    "Question: what is 12 + 34?\nAnswer: 46",
    "<tool>python</tool><input>print(12 + 34)</input>\n<output>\n46\n</output>\nThe answer is \\boxed{46}.",
    "<tool>calculator</tool><input>7 * 8</input>\n<error>\nunknown tool\n</error>\nthe cat sat on the mat",
] * 40


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory):
    """A tokenizer trained here and a tiny random Qwen3-MoE over its vocabulary (init 0.5: peaked, varied
    next-token distributions), saved as one HF directory."""
    from transformers import AutoModelForCausalLM

    from slime_ext.tokenizer import train_tokenizer
    from tests.megatron_fixtures import tiny_moe_config

    d = tmp_path_factory.mktemp("envs_model")
    tok = train_tokenizer(TEXTS, vocab_size=320, out_dir=d)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(tiny_moe_config(vocab_size=len(tok), initializer_range=0.5,
                                                             max_position_embeddings=512))
    model.save_pretrained(d)
    return d


@pytest.fixture(scope="session")
def tokenizer(model_dir):
    from slime_ext.tokenizer import load_tokenizer

    return load_tokenizer(model_dir)


def embedded_engine(model_dir, kernel: str = "auto"):
    from slime_ext.engine.embedded import EmbeddedEngine

    torch.set_num_threads(1)
    return EmbeddedEngine.from_pretrained(str(model_dir), kernel=kernel)


class ScriptedEnv(Environment):
    """Answers turn k with OBSERVATIONS[k] until turn `done_after`, then ends the episode; a turn that ended on
    EOS ends it at once. Records what it was shown."""

    OBSERVATIONS = ["\n<output>\n46 cats\n</output>\n", "\n<error>\nthe mat: 12\n</error>\n",
                    "\n<output>\nQuestion: 7 + 8\n</output>\n", "\n<output>\n1\n</output>\n"]

    def __init__(self, settings: Any = None, tokenizer: Any = None, done_after: int = 3, stop: tuple = (),
                 eos_token_id: int = 0):
        super().__init__(settings, tokenizer)
        self.done_after, self.stop, self.eos = done_after, tuple(stop), eos_token_id
        self.seen: list[tuple[int, str, str]] = []

    def step(self, episode, turn):
        self.seen.append((turn.index, turn.text, turn.finish_reason))
        if turn.index + 1 >= self.done_after or (turn.output_ids and turn.output_ids[-1] == self.eos):
            return EnvStep(done=True)
        return EnvStep(observation=self.OBSERVATIONS[turn.index % len(self.OBSERVATIONS)], tool_calls=1,
                       tool_errors=int(turn.index == 1), info={"turn": turn.index})


class RecordingEngine:
    """Any engine, with every generate call's requests and results kept in order."""

    def __init__(self, engine: Any):
        self.engine = engine
        self.calls: list[tuple[list, list]] = []

    def generate(self, requests):
        results = self.engine.generate(requests)
        self.calls.append((list(requests), list(results)))
        return results

    def by_rid(self) -> dict[str, tuple[Any, Any]]:
        return {q.rid: (q, r) for reqs, ress in self.calls for q, r in zip(reqs, ress)}
