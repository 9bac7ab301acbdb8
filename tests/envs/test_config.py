"""The multi-turn config keys: each acts only with `rollout.env`, and a bad value is an error naming its key."""

from __future__ import annotations

import pytest

from slime_ext.config import load_config
from slime_ext.config.loader import ConfigError
from tests.conftest import CONFIGS


def load(*overrides: str):
    return load_config(CONFIGS / "grpo.yaml", list(overrides)).config


def test_defaults_keep_the_single_turn_path_and_an_env_gets_its_limits():
    r = load().rollout
    assert r.env is None and r.env_settings == {}
    r = load("rollout.env=tools", "rollout.max_response_len=100").rollout
    assert (r.episode_turns, r.episode_total_tokens, r.max_turn_tokens) == (r.DEFAULT_MAX_TURNS, 100, None)
    r = load("rollout.env=tools", "rollout.max_turns=2", "rollout.max_total_tokens=80", "rollout.max_turn_tokens=20",
             "rollout.env_settings.tools=[calculator]", "rollout.env_settings.calculator.timeout_s=1").rollout
    assert (r.episode_turns, r.episode_total_tokens, r.max_turn_tokens) == (2, 80, 20)


@pytest.mark.parametrize("overrides, named", [
    (["rollout.max_turns=3"], "rollout.max_turns = 3 but rollout.env is null"),
    (["rollout.max_total_tokens=50"], "rollout.max_total_tokens = 50 but rollout.env is null"),
    (["rollout.max_turn_tokens=5"], "rollout.max_turn_tokens = 5 but rollout.env is null"),
    (["rollout.env_settings.tools=[python]"], "rollout.env_settings is set but rollout.env is null"),
    (["rollout.env=shell"], "rollout.env = 'shell' is not a registered environment"),
    (["rollout.env=tools", "rollout.max_total_tokens=1000"], "rollout.max_total_tokens = 1000 exceeds"),
    (["rollout.env=tools", "rollout.max_turn_tokens=999"], "rollout.max_turn_tokens = 999 exceeds"),
    (["rollout.env=tools", "rollout.max_turns=0"], "rollout.max_turns"),
    (["rollout.env=tools", "rollout.env_settings.python.timeout_s=1"], "rollout.env_settings.python.timeout_s"),
    (["rollout.env=tools", "rollout.env_settings.pyton.timeout_s=3"], "rollout.env_settings.pyton"),
    (["rollout.env=tools", "rollout.env_settings.tools=[shell]"], "tools ['shell'] are not registered"),
    (["rollout.env=tools", "rollout.env_settings.tools=[python]", "rollout.env_settings.calculator.timeout_s=3"],
     "settings for ['calculator'] are given but tools"),
])
def test_bad_keys_are_errors_naming_the_key(overrides, named):
    with pytest.raises(ConfigError) as info:
        load(*overrides)
    assert named in str(info.value), str(info.value)


# -- the tools task (configs/grpo_tools.yaml and its baseline) ----------------------------------------------
def test_the_tools_configs_share_their_problems_and_budget_and_differ_in_tools_only():
    tools = load_config(CONFIGS / "grpo_tools.yaml", []).config
    plain = load_config(CONFIGS / "grpo_tools_notools.yaml", []).config
    assert tools.data.synthetic.solution_tool == "calculator" and plain.data.synthetic.solution_tool is None
    assert tools.data.synthetic.model_dump(exclude={"solution_tool"}) == plain.data.synthetic.model_dump(
        exclude={"solution_tool"})
    assert set(tools.data.synthetic.train_levels) == {"T1", "T2"}
    assert tools.rollout.env == "tools" and plain.rollout.env is None
    assert tools.rollout.max_response_len == plain.rollout.max_response_len >= 192
    assert tools.rollout.episode_total_tokens >= 192 and tools.rollout.episode_turns >= 2
    assert tools.rollout.env_settings["tools"] == ["calculator"]


@pytest.mark.parametrize("overrides, named", [
    (["data.synthetic.solution_tool=calculator"], "rollout.env = None: no environment would answer the calls"),
    (["data.synthetic.solution_tool=python", "rollout.env=tools", "rollout.env_settings.tools=[calculator]"],
     "rollout.env_settings.tools = ['calculator'] does not offer it"),
    (["data.synthetic.solution_tool=calculator", "rollout.env=tools", r'data.synthetic.step_separator="\n\n"'],
     "replaces the steps by one tool call"),
    (["data.synthetic.solution_tool=abacus"], "data.synthetic.solution_tool"),
])
def test_tool_solutions_need_an_environment_offering_the_tool(overrides, named):
    with pytest.raises(ConfigError) as info:
        load(*overrides)
    assert named in str(info.value), str(info.value)
