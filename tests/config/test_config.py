"""Config composition, overrides and the exact error messages users see."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
import yaml

from slime_ext.config import ConfigError, load_config
from slime_ext.config.__main__ import main as config_main
from tests.conftest import CONFIGS

METHOD_FILES = sorted(p.name for p in CONFIGS.glob("*.yaml"))


def write(tmp: Path, name: str, text: str) -> Path:
    path = tmp / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text))
    return path


@pytest.mark.parametrize("name", METHOD_FILES)
def test_every_shipped_config_validates(name):
    resolved = load_config(CONFIGS / name)
    assert resolved.config.method == yaml.safe_load((CONFIGS / name).read_text()).get("method", "grpo")


def test_method_files_compose_base_model_and_cluster():
    resolved = load_config(CONFIGS / "duet.yaml")
    cfg = resolved.config
    assert cfg.method == "duet" and cfg.duet.budget_fraction == 0.5
    assert cfg.model.num_experts == 8 and cfg.model.hidden_size == 128  # from models/tiny-qwen3-moe.yaml
    assert cfg.train.threads == 1  # from cluster/local-cpu.yaml
    assert cfg.rollout.n_samples_per_prompt == 8  # from base.yaml
    assert [Path(f).name for f in resolved.files] == ["tiny-qwen3-moe.yaml", "local-cpu.yaml", "base.yaml", "duet.yaml"]
    # collab_grpo extends dagrpo which extends base: phases inherited, method replaced
    collab = load_config(CONFIGS / "collab_grpo.yaml").config
    assert collab.method == "collab_grpo" and [p.name for p in collab.dagrpo.phases] == ["easy", "hard"]


def test_duet_tandem_takes_each_section_from_its_method_file():
    """duet_tandem.yaml extends [tandem.yaml, duet.yaml]: base.yaml comes in twice, so a base key that
    tandem.yaml changed would be reset by duet.yaml's copy of base; this pins the composition."""
    both = load_config(CONFIGS / "duet_tandem.yaml").config
    tandem, duet = load_config(CONFIGS / "tandem.yaml").config, load_config(CONFIGS / "duet.yaml").config
    assert both.method == "duet_tandem" and both.run.name == "duet_tandem"
    assert both.tandem == tandem.tandem and both.data == tandem.data  # paragraph steps, junior, eval axes
    assert both.duet == duet.duet and both.duet.budget_fraction == 0.5
    for section in ("model", "train", "grpo", "reward", "cluster", "eval"):
        assert getattr(both, section) == getattr(tandem, section) == getattr(duet, section), section
    assert both.rollout == duet.rollout and both.rollout.prompt_pool == 512  # DUET's recurring prompt pool
    assert both.rollout.model_copy(update={"prompt_pool": None}) == tandem.rollout


def test_cluster_fragment_for_qwen3_30b_validates(tmp_path):
    path = write(
        tmp_path,
        "run.yaml",
        f"""
        extends: {CONFIGS / 'grpo.yaml'}
        include: [{CONFIGS / 'models/qwen3-30b-a3b.yaml'}, {CONFIGS / 'cluster/h100x8-qwen3-30b-a3b.yaml'}]
        """,
    )
    cfg = load_config(path).config
    assert cfg.model.num_experts == 128 and cfg.model.num_experts_per_tok == 8 and cfg.model.vocab_size == 151936
    par = cfg.train.parallel
    assert (par.tensor_model_parallel_size, par.expert_model_parallel_size, par.sequence_parallel) == (4, 8, True)
    assert cfg.rollout.engine == "sglang"


def test_overrides_are_typed_and_win():
    cfg = load_config(CONFIGS / "grpo.yaml", ["rollout.temperature=0.7", "eval.k=[1,2]", "run.resume=null"]).config
    assert cfg.rollout.temperature == 0.7 and cfg.eval.k == [1, 2] and cfg.run.resume is None
    assert isinstance(cfg.rollout.temperature, float)


def test_unknown_key_names_file_path_and_closest_key(tmp_path):
    path = write(
        tmp_path,
        "bad.yaml",
        f"""
        extends: {CONFIGS / 'grpo.yaml'}
        rollout:
          tempurature: 0.5
        """,
    )
    with pytest.raises(ConfigError) as info:
        load_config(path)
    (msg,) = info.value.problems
    assert msg == f"{path}: unknown key 'rollout.tempurature'; did you mean 'rollout.temperature'?"


def test_unknown_key_in_included_fragment_blames_the_fragment(tmp_path):
    frag = write(tmp_path, "models/broken.yaml", "model:\n  num_expert: 4\n")
    path = write(tmp_path, "run.yaml", f"extends: {CONFIGS / 'base.yaml'}\ninclude: [models/broken.yaml]\n")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert info.value.problems == [f"{frag}: unknown key 'model.num_expert'; did you mean 'model.num_experts'?"]


def test_unknown_top_level_section_and_no_close_match(tmp_path):
    path = write(tmp_path, "bad.yaml", "zzzqqq: 1\n")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    (msg,) = info.value.problems
    assert msg.startswith(f"{path}: unknown key 'zzzqqq'; valid keys here: ")
    assert "rollout" in msg and "tandem_axes" in msg
    assert "duet" not in msg  # another method's section is no key of a grpo run


def test_bad_type_and_range_name_key_and_expected_form(tmp_path):
    path = write(
        tmp_path,
        "bad.yaml",
        """
        rollout:
          n_samples_per_prompt: many
        grpo:
          eps_clip_low: 1.5
        """,
    )
    with pytest.raises(ConfigError) as info:
        load_config(path)
    problems = sorted(info.value.problems)
    assert problems[0].startswith(f"{path}: key 'grpo.eps_clip_low' = 1.5: expected float >= 0 and <= 1")
    assert problems[1].startswith(f"{path}: key 'rollout.n_samples_per_prompt' = 'many': expected int >= 1")
    assert "valid integer" in problems[1]


def test_bad_override_is_attributed_to_command_line():
    with pytest.raises(ConfigError) as info:
        load_config(CONFIGS / "grpo.yaml", ["train.lr=-1"])
    (msg,) = info.value.problems
    assert msg.startswith("command line override 'train.lr=-1': key 'train.lr' = -1: expected float > 0")
    with pytest.raises(ConfigError, match="must look like key.path=value"):
        load_config(CONFIGS / "grpo.yaml", ["train.lr"])
    with pytest.raises(ConfigError, match="'rollout.temperature' is a value, not a section"):
        load_config(CONFIGS / "grpo.yaml", ["rollout.temperature.x=1"])


def test_literal_choice_and_cross_field_checks(tmp_path):
    with pytest.raises(ConfigError) as info:
        load_config(CONFIGS / "grpo.yaml", ["grpo.kl_estimator=k9"])
    assert "grpo.kl_estimator" in info.value.problems[0] and "'k1'" in info.value.problems[0]
    with pytest.raises(ConfigError, match="n_min .* must be <= n_max"):
        load_config(CONFIGS / "duet.yaml", ["duet.n_min=40"])
    with pytest.raises(ConfigError, match=r"eval.k values \[8\]"):
        load_config(CONFIGS / "grpo.yaml", ["eval.k=[1,8]"])
    assert load_config(CONFIGS / "grpo.yaml").config.eval.every is None  # warm start and final evaluations only
    assert load_config(CONFIGS / "grpo.yaml", ["eval.every=10"]).config.eval.every == 10
    with pytest.raises(ConfigError, match=r"eval.every = 10 with rollout.max_staleness = 1"):
        load_config(CONFIGS / "grpo.yaml", ["eval.every=10", "rollout.max_staleness=1"])
    with pytest.raises(ConfigError, match="eval.every"):
        load_config(CONFIGS / "grpo.yaml", ["eval.every=0"])


def test_list_items_are_validated_with_index(tmp_path):
    path = write(tmp_path, "bad.yaml", "method: dagrpo\ndagrpo:\n  phases:\n    - {name: a, tua: 0.1}\n")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert info.value.problems == [f"{path}: unknown key 'dagrpo.phases.0.tua'; did you mean 'dagrpo.phases.0.tau'?"]


def test_missing_file_cycle_and_non_mapping(tmp_path):
    with pytest.raises(ConfigError, match="config file not found"):
        load_config(tmp_path / "nope.yaml")
    a = write(tmp_path, "a.yaml", "extends: b.yaml\n")
    write(tmp_path, "b.yaml", "extends: a.yaml\n")
    with pytest.raises(ConfigError, match="circular extends/include"):
        load_config(a)
    lst = write(tmp_path, "list.yaml", "- 1\n- 2\n")
    with pytest.raises(ConfigError, match="top level must be a mapping"):
        load_config(lst)


def test_resolved_config_written_and_reloadable(tmp_path):
    resolved = load_config(CONFIGS / "tandem.yaml", ["tandem.kappa=16"])
    out = resolved.write(tmp_path)
    text = out.read_text()
    assert "# overrides: tandem.kappa=16" in text
    again = load_config(out)  # the written file is itself a complete, valid config
    assert again.config == resolved.config


def test_check_cli_exit_codes(capsys):
    assert config_main(["--check", str(CONFIGS / "grpo.yaml")]) == 0
    out = capsys.readouterr()
    assert "method: grpo" in out.out
    assert config_main(["--check", str(CONFIGS / "grpo.yaml"), "rollout.tempurature=1"]) == 2
    err = capsys.readouterr().err
    assert "unknown key 'rollout.tempurature'; did you mean 'rollout.temperature'?" in err
