"""Issue 29 item 2: a run's config holds the run-wide sections plus its own method's sections only; a key of
another method is an error naming it, and composition (DUET on Tandem) declares the sections it composes."""

from __future__ import annotations

import pickle
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml
from pydantic import Field, ValidationError
from ray import cloudpickle

from slime_ext.config import ConfigError, load_config, schema
from slime_ext.config.sections import CoreConfig, Section
from slime_ext.methods import registry
from slime_ext.methods.registry import MethodEntry
from tests.conftest import CONFIGS, REPO

CORE = set(CoreConfig.model_fields)
CONFIG_FILES = sorted(p.name for p in CONFIGS.glob("*.yaml"))


def problems(config, *overrides: str) -> list[str]:
    with pytest.raises(ConfigError) as info:
        load_config(config, list(overrides))
    return info.value.problems


@pytest.mark.parametrize("name", CONFIG_FILES)
def test_every_config_has_the_core_and_its_entrys_sections_only(name):
    cfg = load_config(CONFIGS / name).config
    assert cfg.method == yaml.safe_load((CONFIGS / name).read_text()).get("method", cfg.method)
    assert set(type(cfg).model_fields) == CORE | set(registry.METHODS[cfg.method].sections)
    assert type(cfg) is schema.config_model(cfg.method)


def test_a_grpo_run_with_a_tandem_key_names_the_section_its_methods_and_the_file(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text(f"extends: {CONFIGS / 'grpo.yaml'}\ntandem:\n  kappa: 16\n")
    assert problems(path) == [f"{path}: section 'tandem' belongs to method(s) tandem, tandem_klreg, duet_tandem; "
                              "this run's method is 'grpo'"]


def test_the_same_by_a_command_line_override_names_the_override():
    assert problems(CONFIGS / "grpo.yaml", "tandem.kappa=16") == [
        "command line override 'tandem.kappa=16': section 'tandem' belongs to method(s) tandem, tandem_klreg, "
        "duet_tandem; this run's method is 'grpo'"]
    # a method's file turned into another method's run by an override: every foreign section is named, with the
    # file that set it, and other errors are still reported
    msgs = problems(CONFIGS / "duet_tandem.yaml", "method=duet", "rollout.temperature=-1")
    assert msgs[0] == ("configs/tandem.yaml: section 'tandem' belongs to method(s) tandem, tandem_klreg, "
                       "duet_tandem; this run's method is 'duet'")
    assert len(msgs) == 2 and msgs[1].startswith("command line override 'rollout.temperature=-1': key ")


def test_an_unregistered_method_names_the_key_the_place_and_the_registered_names(tmp_path):
    (msg,) = problems(CONFIGS / "grpo.yaml", "method=tandm")
    assert msg.startswith("command line override 'method=tandm': key 'method' = 'tandm' is not a registered method; "
                          "registered: grpo, dapo, tandem,")
    path = tmp_path / "bad.yaml"
    path.write_text("method: [grpo]\n")
    (msg,) = problems(path)
    assert msg.startswith(f"{path}: key 'method' = ['grpo'] is not a registered method")


def test_the_method_overridden_on_the_command_line_picks_the_schema():
    cfg = load_config(CONFIGS / "tandem_grpo.yaml", ["method=tandem", "tandem.kappa=8"]).config
    assert cfg.method == "tandem" and cfg.tandem.kappa == 8 and cfg.tandem_axes.enabled
    # an error inside the run's own sections is explained against the run's schema
    (msg,) = problems(CONFIGS / "tandem.yaml", "tandem.kapa=8")
    assert msg == "command line override 'tandem.kapa=8': unknown key 'tandem.kapa'; did you mean 'tandem.kappa'?"


def test_tandem_grpo_turns_the_axes_on_without_a_tandem_section():
    cfg = load_config(CONFIGS / "tandem_grpo.yaml").config
    assert cfg.method == "grpo" and cfg.tandem_axes.enabled is True and cfg.tandem_axes.prompts == 256
    assert not hasattr(cfg, "tandem")
    for name in ("tandem.yaml", "tandem_klreg.yaml", "duet_tandem.yaml"):
        assert load_config(CONFIGS / name).config.tandem_axes.enabled is True, name
    assert load_config(CONFIGS / "grpo.yaml").config.tandem_axes.enabled is False


def test_every_entry_with_the_axes_evaluation_declares_its_section():
    """Composition declares what it composes: an entry that lists an evaluation declares the section it reads."""
    axes = "slime_ext.methods.tandem.eval_axes:final_evaluation"
    for name, entry in registry.METHODS.items():
        if axes in entry.evaluations or entry.checkpoint_evaluations:
            assert entry.sections.get("tandem_axes") == "slime_ext.methods.tandem.config:TandemAxesConfig", name
    assert set(registry.METHODS["duet_tandem"].sections) == {"duet", "tandem", "tandem_axes"}


def test_a_model_checks_that_its_method_reads_its_sections():
    tandem = schema.config_model("tandem")
    assert schema.config_model("tandem_klreg") is tandem and tandem.__name__ == "Config__tandem__tandem_axes"
    assert tandem().method == "tandem" and tandem(method="tandem_klreg").method == "tandem_klreg"
    with pytest.raises(ValidationError, match="method 'grpo' reads the sections"):
        tandem.model_validate({"method": "grpo"})
    with pytest.raises(ValidationError, match="method 'nope' is not registered"):
        tandem.model_validate({"method": "nope"})
    with pytest.raises(ValueError, match="method 'nope' is not registered"):
        schema.config_model("nope")


def test_the_module_level_config_is_the_grpo_model():
    assert schema.Config is schema.config_model() is schema.config_model("grpo")
    cfg = schema.Config(train={"steps": 3})
    assert cfg.method == "grpo" and cfg.train.steps == 3 and not hasattr(cfg, "tandem")


@pytest.mark.parametrize("name", ["tandem.yaml", "duet_tandem.yaml", "grpo.yaml", "sxs_rl.yaml"])
def test_configs_pickle_by_reference(name):
    cfg = load_config(CONFIGS / name, ["run.seed=3"]).config
    assert pickle.loads(pickle.dumps(cfg)) == cfg
    assert cloudpickle.loads(cloudpickle.dumps(cfg)) == cfg
    assert getattr(schema, type(cfg).__name__) is type(cfg)


def test_a_config_unpickles_in_a_process_that_never_composed_its_model(tmp_path):
    """Ray actors are fresh processes: `slime_ext.config.schema.Config__...` is composed on first access."""
    cfg = load_config(CONFIGS / "duet_tandem.yaml", ["tandem.kappa=7"]).config
    (tmp_path / "cfg.pkl").write_bytes(cloudpickle.dumps(cfg))
    code = textwrap.dedent(f"""
        import pickle
        cfg = pickle.loads(open({str(tmp_path / 'cfg.pkl')!r}, "rb").read())
        print(type(cfg).__name__, cfg.method, cfg.tandem.kappa, cfg.duet.budget_fraction, cfg.tandem_axes.enabled)
    """)
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True).stdout
    assert out.split() == ["Config__duet__tandem__tandem_axes", "duet_tandem", "7", "0.5", "True"]


class RuntimeSection(Section):
    """The section of a method registered at run time (below)."""

    weight: float = Field(0.5, ge=0)


def test_a_method_registered_at_run_time_is_loaded_with_its_new_section(tmp_path):
    name = "runtime_method_for_sections_test"
    registry.register_method(name, MethodEntry("slime_ext.methods.grpo.method:GRPO",
                                               {"runtime_section": f"{__name__}:RuntimeSection"}))
    try:
        path = tmp_path / "run.yaml"
        path.write_text(f"extends: {CONFIGS / 'grpo.yaml'}\nmethod: {name}\nruntime_section:\n  weight: 0.25\n")
        cfg = load_config(path).config
        assert cfg.method == name and cfg.runtime_section.weight == 0.25 and not hasattr(cfg, "tandem_axes")
        assert pickle.loads(pickle.dumps(cfg)) == cfg
        assert problems(path, "runtime_section.wieght=1") == [
            "command line override 'runtime_section.wieght=1': unknown key 'runtime_section.wieght'; did you mean "
            "'runtime_section.weight'?"]
        # its section in another method's run is named like any other
        assert problems(CONFIGS / "grpo.yaml", "runtime_section.weight=1") == [
            f"command line override 'runtime_section.weight=1': section 'runtime_section' belongs to method(s) {name}; "
            "this run's method is 'grpo'"]
    finally:
        registry.METHODS.pop(name)
    assert problems(path)[0].startswith(f"{path}: key 'method' = '{name}' is not a registered method")


def test_the_resolved_config_of_a_run_holds_its_sections_only(tmp_path):
    resolved = load_config(CONFIGS / "tandem_grpo.yaml")
    written = yaml.safe_load(resolved.write(tmp_path).read_text())
    assert set(written) == CORE | {"tandem_axes"}
    assert load_config(tmp_path / "config.yaml").config == resolved.config


def test_a_method_config_module_imports_first_in_a_fresh_process():
    """Importing a section's module before anything else (a script that only needs `TandemConfig`) used to fail with a
    circular import: `slime_ext.config` composed the default model, which loads that half-initialised module. One
    interpreter per module, since the cycle only shows on a module's first import."""
    modules = sorted({path.split(":")[0] for path in registry.all_sections_paths().values()})
    assert "slime_ext.methods.tandem.config" in modules
    script = "import importlib, sys; importlib.import_module(sys.argv[1]); from slime_ext.config import Config; " \
             "print('tandem_axes' in Config.model_fields)"
    for module in modules:
        done = subprocess.run([sys.executable, "-c", script, module], cwd=REPO, capture_output=True, text=True,
                              timeout=120)
        assert done.returncode == 0, f"{module}: {done.stderr[-800:]}"
        assert done.stdout.strip() == "True", module


def test_tandem_axes_defaults_load_with_nothing_imported_before():
    """`axes_settings` of a config without a `tandem_axes` section imports `TandemAxesConfig` on its own; it used to
    import `slime_ext.config` first to dodge the cycle the previous test guards against. A fresh process, as there."""
    script = "from slime_ext.methods.tandem.eval_axes import axes_settings; print(axes_settings(object()).prompts)"
    done = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-800:]
    assert done.stdout.strip() == "256"
