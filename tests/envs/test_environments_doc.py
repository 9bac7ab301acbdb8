"""docs/environments.md, executed: the worked example's module, registry line and YAML run a GRPO rollout step
on the embedded engine, and the environment answers as the page says."""

from __future__ import annotations

import sys

import pytest

from slime_ext.config import load_config
from slime_ext.envs import registry
from slime_ext.envs.base import Episode, Turn
from slime_ext.orchestration.rollout_manager import RolloutManager
from tests.doc_examples import fenced_blocks, registry_line, write_package
from tests.conftest import CONFIGS, REPO
from tests.envs.conftest import RecordingEngine, embedded_engine

DOC = REPO / "docs" / "environments.md"
EXAMPLE = "## Writing an environment"


def doc_blocks() -> dict[str, str]:
    """The worked example's fenced blocks, keyed by the file named in the line before each (or 'registry')."""
    text = DOC.read_text().split(EXAMPLE)[1]
    return fenced_blocks(text, "EnvEntry(")


@pytest.fixture
def hint_env(tmp_path, monkeypatch):
    blocks = doc_blocks()
    write_package(tmp_path / "plugins", "my_envs", {"hint.py": blocks["hint.py"]})
    monkeypatch.syspath_prepend(str(tmp_path / "plugins"))
    monkeypatch.delitem(sys.modules, "my_envs", raising=False)
    monkeypatch.delitem(sys.modules, "my_envs.hint", raising=False)
    name, entry = registry_line(blocks["registry"], registry.EnvEntry, {})
    monkeypatch.setitem(registry.ENVS, name, entry)
    yaml_text = blocks["grpo_hint.yaml"].replace("extends: grpo.yaml", f"extends: {CONFIGS / 'grpo.yaml'}")
    (tmp_path / "grpo_hint.yaml").write_text(yaml_text)
    return tmp_path / "grpo_hint.yaml"


def test_the_example_environment_answers_as_described(hint_env):
    cfg = load_config(hint_env).config
    env = registry.build_env(cfg.rollout.env, cfg.rollout.env_settings, None)
    episode = Episode(row={"label": "40"}, turns_left=2)

    def turn(text):
        return Turn(0, (), text, "stop")

    assert env.step(episode, turn("I think 42\n\n")).observation == "User: 42 is too high. Try again.\nAssistant:"
    assert env.step(episode, turn("38\n\n")).observation == "User: 38 is too low. Try again.\nAssistant:"
    assert env.step(episode, turn("no idea\n\n")).observation == "User: please answer with a number.\nAssistant:"
    assert env.step(episode, turn("it is 40\n\n")).done
    quiet = registry.build_env("hint", {"direction": False}, None)
    assert quiet.step(episode, turn("42")).observation == "User: 42 is wrong. Try again.\nAssistant:"


def test_the_example_runs_a_grpo_rollout_step(hint_env, model_dir, tokenizer):
    cfg = load_config(hint_env, ["rollout.manager=driver", "rollout.prompts_per_step=2",
                                 "rollout.n_samples_per_prompt=2", "rollout.max_response_len=64"]).config
    assert (cfg.rollout.env, cfg.rollout.episode_turns, cfg.rollout.max_turn_tokens) == ("hint", 3, 16)
    rows = [{"prompt": f"what is {i} + 34?", "label": str(i + 34), "row_id": i} for i in range(4)]
    engine = RecordingEngine(embedded_engine(model_dir))
    groups, metrics = RolloutManager(cfg, rows, tokenizer, engine).rollout(0)
    samples = [s for g in groups for s in g]
    assert all("\n\n" in q.sampling.stop for reqs, _ in engine.calls for q in reqs)
    assert metrics["env/turns_mean"] > 1 and len(engine.calls) >= 2
    for s in samples:
        observed = [t for t, m in zip(s.response_ids, s.loss_mask) if m == 0]
        text = tokenizer.decode(observed)
        turns = s.metadata["env"]["turn_records"]
        hints = [t["info"].get("hint") for t in turns[:-1]]
        assert text.count("User:") == len(hints) == len(turns) - 1
        assert s.reward is not None and s.advantage is not None
