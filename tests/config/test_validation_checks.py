"""Issue 15 item 4: what a run rejects, `--check` rejects first, and an error names the override that caused it."""

from __future__ import annotations

import json
import math
import types
import typing

import pytest
from pydantic import BaseModel, ValidationError

from slime_ext.config import ConfigError, load_config
from slime_ext.config.__main__ import main as config_main
from slime_ext.config.schema import config_model
from slime_ext.config.sections import Section, SyntheticLevel
from slime_ext.tasks.synthetic_math import ALL_LEVELS
from tests.conftest import CONFIGS

GRPO = CONFIGS / "grpo.yaml"


def problem(config, *overrides: str) -> str:
    with pytest.raises(ConfigError) as info:
        load_config(config, list(overrides))
    (msg,) = info.value.problems
    return msg


# -- the four cases of the issue, through the CLI that scripts run before a job -----------------------------
@pytest.mark.parametrize("config, override, expected", [
    (GRPO, "data.synthetic.train_levels=[L9]", "Input should be 'L0', 'L1', 'L2', 'L3', 'L4', 'L5', 'T1', 'T2', 'V2',"),
    (CONFIGS / "dagrpo.yaml", "dagrpo.cloud_url=null", "method dagrpo needs dagrpo.cloud_url"),
    (GRPO, "rollout.temperature=.inf", "Input should be a finite number"),
    (GRPO, "rollout.max_response_len=5000", "256 + 5000 = 5256 exceeds the model's context "
                                            "(model.max_position_embeddings = 1024)"),
])
def test_check_cli_rejects_what_the_run_would(config, override, expected, capsys):
    assert config_main(["--check", str(config), override]) == 2
    err = capsys.readouterr().err
    assert f"command line override '{override}'" in err and expected in err


# -- synthetic levels ---------------------------------------------------------------------------------------
def test_level_names_are_the_generators_levels():
    assert typing.get_args(SyntheticLevel) == tuple(ALL_LEVELS)


@pytest.mark.parametrize("override", ["data.synthetic.eval_levels=[L2, l3]", "data.synthetic.train_levels=[]"])
def test_bad_or_empty_level_lists_are_rejected(override):
    assert problem(GRPO, override).startswith(f"command line override '{override}': key 'data.synthetic.")


def test_dagrpo_phase_levels_are_checked():
    override = "dagrpo.phases=[{name: a, levels: [L7], steps: 40}]"
    msg = problem(CONFIGS / "dagrpo.yaml", override)
    assert msg.startswith(f"command line override '{override}': key 'dagrpo.phases.0.levels.0' = 'L7'")


# -- DA-GRPO's cloud ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["dagrpo.yaml", "collab_grpo.yaml"])
@pytest.mark.parametrize("url", ["null", "''"])
def test_methods_that_ask_the_cloud_need_its_url(name, url):
    assert f"needs dagrpo.cloud_url" in problem(CONFIGS / name, f"dagrpo.cloud_url={url}")


def test_local_only_baseline_needs_no_cloud_url():
    cfg = load_config(CONFIGS / "dagrpo_local_only.yaml", ["dagrpo.cloud_url=null"]).config
    assert cfg.dagrpo.local_only is True and cfg.dagrpo.cloud_url is None
    # a section the method does not read is not part of its config: plain GRPO has no dagrpo section
    assert problem(GRPO, "dagrpo.cloud_url=null") == (
        "command line override 'dagrpo.cloud_url=null': section 'dagrpo' belongs to method(s) dagrpo, collab_grpo; "
        "this run's method is 'grpo'")


# -- finite floats, every section -----------------------------------------------------------------------------
def _float_keys(model: type[BaseModel], prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """Every float key of the schema (nested sections included; list-of-model fields are skipped)."""
    keys = []
    for name, info in model.model_fields.items():
        ann = info.annotation
        args = typing.get_args(ann) if typing.get_origin(ann) in (typing.Union, types.UnionType) else (ann,)
        if float in args:
            keys.append(prefix + (name,))
        for arg in args:
            if isinstance(arg, type) and issubclass(arg, Section):
                keys += _float_keys(arg, prefix + (name,))
    return keys


def test_no_float_key_accepts_inf_or_nan():
    from slime_ext.methods.registry import METHODS

    checked = set()
    for method in METHODS:  # each run's model: the run-wide sections and that method's own
        model = config_model(method)
        keys = _float_keys(model)
        assert len(keys) > 30 and ("rollout", "temperature") in keys and ("train", "parallel") not in keys
        for key in keys:
            if key in checked:
                continue
            checked.add(key)
            for bad in (math.inf, -math.inf, math.nan):
                data: dict = {"method": method}
                node = data
                for part in key[:-1]:
                    node = node.setdefault(part, {})
                node[key[-1]] = bad
                with pytest.raises(ValidationError) as info:
                    model.model_validate(data)
                assert [e["type"] for e in info.value.errors()] == ["finite_number"], key
    assert len(checked) > 40 and ("tandem", "p_senior") in checked and ("duet", "budget_fraction") in checked


@pytest.mark.parametrize("phase", ["{name: a, steps: 40, tau_schedule: [[0, .nan]]}", "{name: a, steps: 40, tau: .inf}"])
def test_floats_inside_list_items_are_finite_too(phase):
    assert "Input should be a finite number" in problem(CONFIGS / "dagrpo.yaml", f"dagrpo.phases=[{phase}]")


# -- the context ----------------------------------------------------------------------------------------------
def test_prompt_plus_response_must_fit_the_yaml_context():
    assert load_config(GRPO, ["rollout.max_prompt_len=864", "rollout.max_response_len=160"])  # exactly 1024
    assert problem(GRPO, "rollout.max_prompt_len=865") == (
        "command line override 'rollout.max_prompt_len=865', configs/base.yaml, configs/models/tiny-qwen3-moe.yaml: "
        "rollout.max_prompt_len + rollout.max_response_len = 865 + 160 = 1025 exceeds the model's context "
        "(model.max_position_embeddings = 1024)")


def test_an_hf_checkpoint_context_wins_over_the_yaml(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"max_position_embeddings": 400}))
    msg = problem(GRPO, f"model.hf_path={tmp_path}")
    assert f"256 + 160 = 416 exceeds the model's context (max_position_embeddings of {tmp_path / 'config.json'} = 400)" in msg
    ok = load_config(GRPO, [f"model.hf_path={tmp_path}", "rollout.max_prompt_len=240"]).config
    assert ok.model.context_length() == (400, f"max_position_embeddings of {tmp_path / 'config.json'}")


# -- other checks that used to wait for the run ---------------------------------------------------------------
def test_tandem_on_sglang_needs_the_checkpoint():
    msg = problem(CONFIGS / "tandem.yaml", "rollout.engine=sglang")
    assert "method tandem on rollout.engine=sglang needs model.hf_path" in msg
    assert msg.startswith("command line override 'rollout.engine=sglang'")


# -- where a value came from -----------------------------------------------------------------------------------
@pytest.mark.parametrize("override, unknown", [("foo.bar=1", "'foo'"), ("rollout.foo.bar=2", "'rollout.foo'"),
                                               ("foo=1", "'foo'")])
def test_unknown_keys_from_overrides_name_the_override(override, unknown):
    assert problem(GRPO, override).startswith(f"command line override '{override}': unknown key {unknown};")


def test_cross_field_checks_name_every_place_their_keys_were_set():
    assert problem(CONFIGS / "duet.yaml", "duet.n_min=40") == \
        "command line override 'duet.n_min=40', configs/duet.yaml: duet: n_min (40) must be <= n_max (32)"
    msg = problem(CONFIGS / "dapo.yaml", "dapo.overlong_buffer=500")
    assert msg.startswith("command line override 'dapo.overlong_buffer=500', configs/base.yaml: dapo.overlong_buffer (500)")
    msg = problem(CONFIGS / "dagrpo.yaml", "train.steps=30")
    assert msg.startswith("command line override 'train.steps=30', configs/dagrpo.yaml: train.steps (30) must equal")


def test_cpu_engine_servers_have_no_tensor_parallelism(capsys):
    assert config_main(["--check", str(GRPO), "rollout.engine=sglang", "sglang.tp_size=2"]) == 2
    assert "sglang.tp_size = 2 on a CPU run (cluster.gpus_per_node = 0)" in capsys.readouterr().err
    assert config_main(["--check", str(GRPO), "rollout.engine=sglang", "sglang.num_engines=2"]) == 0


def test_a_global_batch_must_divide_the_rollout_batch():
    msg = problem(GRPO, "train.global_batch_size=100")
    assert "train.global_batch_size = 100 does not divide the rollout batch" in msg and "= 512" in msg
    assert "rollout.prompts_per_step" in msg and "256" in msg
    msg = problem(GRPO, "train.global_batch_size=1", "train.parallel.data_parallel_size=2")
    assert "train.parallel.data_parallel_size = 2" in msg
    cfg = load_config(GRPO, ["train.global_batch_size=128"]).config
    assert cfg.minibatches_per_step() == 4 and cfg.grpo.resolved_old_logprobs(4) == "trainer"
    assert load_config(GRPO, []).config.grpo.resolved_old_logprobs(1) == "engine"


def test_a_mismatch_correction_needs_the_trainers_old_logprobs():
    msg = problem(GRPO, "grpo.mismatch.mode=truncate", "grpo.old_logprobs=engine")
    assert "grpo.mismatch.mode = truncate needs the trainer's old logprobs" in msg and "grpo.old_logprobs=trainer" in msg
    cfg = load_config(GRPO, ["grpo.mismatch.mode=mask"]).config
    assert cfg.grpo.resolved_old_logprobs(cfg.minibatches_per_step()) == "trainer"
    assert "grpo.mismatch.low" in problem(GRPO, "grpo.mismatch.low=1.5")


# -- asynchronous rollouts (rollout.max_staleness) -------------------------------------------------------------
def test_off_policy_on_colocated_gpus_names_both_keys_and_the_fix(capsys):
    assert config_main(["--check", str(GRPO), "rollout.max_staleness=1", "cluster.gpus_per_node=8"]) == 2
    err = capsys.readouterr().err
    assert ("rollout.max_staleness = 1 with cluster.colocate = true on a GPU cluster (cluster.gpus_per_node = 8)"
            in err) and "set cluster.colocate=false" in err
    # engines on their own GPUs, or a CPU run (its processes never sleep): accepted (DP derived on GPUs: --check
    # also builds the cluster plan, which refuses the CPU config's data_parallel_size 2 on 8 GPUs)
    assert config_main(["--check", str(GRPO), "rollout.max_staleness=1", "cluster.gpus_per_node=8",
                        "cluster.colocate=false", "train.parallel.data_parallel_size=1"]) == 0
    assert config_main(["--check", str(GRPO), "rollout.max_staleness=1"]) == 0


@pytest.mark.parametrize("overrides, expected", [
    (["rollout.partial_rollouts=true"], "rollout.partial_rollouts = True but rollout.max_staleness is 0"),
    (["rollout.stale_groups=drop"], "rollout.stale_groups = 'drop' but rollout.max_staleness is 0"),
    (["rollout.max_staleness=1", "rollout.stale_tokens=correct"],
     "rollout.stale_tokens = 'correct' but rollout.partial_rollouts is false"),
    (["rollout.stale_tokens=mask"], "rollout.stale_tokens = 'mask' but rollout.partial_rollouts is false"),
    (["rollout.off_policy_steps=1"], "rollout.off_policy_steps = 1 was replaced by rollout.max_staleness"),
    (["rollout.max_staleness=1", "rollout.pause_mode=retract"],
     "rollout.pause_mode = 'retract' but rollout.partial_rollouts is false"),
    (["rollout.max_staleness=1", "rollout.partial_rollouts=true", "rollout.pause_mode=in_place"],
     "rollout.pause_mode = 'in_place' pauses requests inside engine servers (SGLang's /pause_generation), but "
     "rollout.engine is 'embedded'"),
    (["rollout.max_staleness=1", "rollout.partial_rollouts=true", "rollout.engine=sglang", "train.routing_replay=true",
      "rollout.pause_mode=retract"], "rollout.pause_mode = 'retract' with train.routing_replay = true"),
    (["rollout.max_staleness=-1"], "key 'rollout.max_staleness' = -1"),
    (["rollout.max_staleness=1", "rollout.partial_rollouts=true", "rollout.stale_tokens=drop"],
     "key 'rollout.stale_tokens' = 'drop'"),
])
def test_off_policy_keys_that_would_change_nothing_are_rejected(overrides, expected):
    with pytest.raises(ConfigError) as info:
        load_config(GRPO, overrides)
    (msg,) = info.value.problems
    assert expected in msg and msg.startswith(f"command line override '{overrides[-1]}'")


@pytest.mark.parametrize("config_file, overrides, expected", [
    ("duet.yaml", ["rollout.max_staleness=2"], "rollout.max_staleness = 2 with method 'duet': its budget allocation"),
    ("dagrpo.yaml", ["rollout.max_staleness=3"], "rollout.max_staleness = 3 with method 'dagrpo': its dual variable"),
    ("tandem.yaml", ["rollout.max_staleness=2", "rollout.partial_rollouts=true"],
     "rollout.partial_rollouts = true with method 'tandem': its requests carry the per-request sampler(s) of "
     "['sglang_patches.tandem']"),
    ("sxs_rl.yaml", ["rollout.max_staleness=1", "rollout.partial_rollouts=true"], "with method 'sxs_rl'"),
])
def test_methods_that_cannot_run_asynchronously_are_refused_at_check(capsys, config_file, overrides, expected):
    assert config_main(["--check", str(CONFIGS / config_file), *overrides]) == 2
    assert expected in capsys.readouterr().err
    # what they can run: one step stale without partial rollouts (and Tandem / SxS any K)
    assert config_main(["--check", str(CONFIGS / config_file), "rollout.max_staleness=1"]) == 0


def test_partial_rollouts_default_to_masking_stale_tokens():
    r = load_config(GRPO, ["rollout.max_staleness=1", "rollout.partial_rollouts=true"]).config.rollout
    assert r.stale_tokens is None and r.stale_token_policy == "mask"
    r = load_config(GRPO, ["rollout.max_staleness=1", "rollout.partial_rollouts=true",
                           "rollout.stale_tokens=correct"]).config.rollout
    assert r.stale_token_policy == "correct"
