"""`sglang.weight_sync` resolves to the path that fits the layout, says why, and refuses what cannot run."""

from __future__ import annotations

from pathlib import Path

import pytest

from slime_ext.config.__main__ import main as check_main
from slime_ext.config.loader import ConfigError, load_config

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = ROOT / "configs"


def _thirty_b(tmp_path: Path) -> Path:
    """The launcher's composition: a method file with the 30B model and the 8xH100 cluster fragments."""
    path = tmp_path / "run.yaml"
    path.write_text(f"extends: {CONFIGS / 'grpo.yaml'}\ninclude:\n  - {CONFIGS / 'models/qwen3-30b-a3b.yaml'}\n"
                    f"  - {CONFIGS / 'cluster/h100x8-qwen3-30b-a3b.yaml'}\n")
    return path


@pytest.mark.parametrize("overrides,path", [
    (["cluster.colocate=true"], "tensor"),
    (["cluster.colocate=false"], "distributed"),
    (["cluster.colocate=true", "sglang.weight_sync=disk"], "disk"),
    (["cluster.colocate=false", "sglang.weight_sync=tensor"], "tensor"),
])
def test_auto_resolves_by_layout_and_an_explicit_choice_stays(overrides, path):
    cfg = load_config(CONFIGS / "grpo_quick.yaml", ["rollout.engine=sglang", *overrides]).config
    assert cfg.sglang.weight_sync == path
    reason = cfg.sglang.weight_sync_reason(cfg.cluster.colocate)
    explicit = any(o.startswith("sglang.weight_sync=") for o in overrides)
    assert reason.startswith("set in the config") == explicit
    assert ("colocated" in reason) == (path == "tensor" and not explicit)


def test_check_on_the_30b_cluster_config_prints_tensor(tmp_path, capsys):
    assert check_main(["--check", str(_thirty_b(tmp_path))]) == 0
    err = capsys.readouterr().err
    assert "# weight sync: tensor (the default for colocated engines" in err


def test_delta_sync_is_refused_on_sglangs_own_engines(tmp_path, capsys):
    assert check_main(["--check", str(_thirty_b(tmp_path)), "sglang.weight_sync_delta=true"]) == 2
    err = capsys.readouterr().err
    assert "sglang.weight_sync_delta" in err and "fused parameters" in err and "qkv_proj" in err
    # the project's CPU server takes deltas through the custom loader
    cfg = load_config(CONFIGS / "grpo_quick.yaml", ["rollout.engine=sglang", "sglang.weight_sync_delta=true"]).config
    assert cfg.sglang.weight_sync == "tensor" and cfg.sglang.weight_sync_delta


def test_a_missing_sglang_package_stops_check_and_the_driver_before_any_work(tmp_path, monkeypatch, capsys):
    import importlib.util

    from slime_ext.orchestration import driver

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "sglang" else real(name, *a))
    args = [str(CONFIGS / "grpo_quick.yaml"), "rollout.engine=sglang", f"run.output_dir={tmp_path / 'runs'}"]
    assert check_main(["--check", *args]) == 2
    assert "bash scripts/setup.sh" in capsys.readouterr().err
    assert driver.main(args) == 2
    assert "sglang.weight_sync=tensor" in capsys.readouterr().err
    assert not (tmp_path / "runs").exists()  # no run directory: nothing started
    # disk needs no sglang package
    assert check_main(["--check", *args, "sglang.weight_sync=disk"]) == 0


def test_unknown_weight_sync_names_the_key():
    with pytest.raises(ConfigError, match="weight_sync"):
        load_config(CONFIGS / "grpo_quick.yaml", ["sglang.weight_sync=nfs"])
