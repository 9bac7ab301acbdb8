"""docs/adding-a-method.md, executed: its package, registry line and YAML run two RL steps end to end."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from slime_ext.methods import registry
from tests.doc_examples import fenced_blocks, registry_line, tiny_job, write_package
from tests.conftest import CONFIGS, REPO

DOC = REPO / "docs" / "adding-a-method.md"
TINY = tiny_job(n_samples=8, max_response_len=24)


SECOND = "\n# A second example"


def doc_blocks(part: int = 0) -> dict[str, str]:
    """The fenced blocks of the page's first example (part 0) or second (part 1), keyed by the file named in the
    line before each (or 'registry')."""
    text = DOC.read_text().split(SECOND)[part]
    return fenced_blocks(text, "MethodEntry(")


def test_the_page_has_the_three_parts():
    blocks = doc_blocks()
    assert {"config.py", "method.py", "registry"} <= set(blocks) and "extends:" in blocks.get("length_penalty.yaml", "")
    second = doc_blocks(1)
    assert {"sentence_cap.py", "config.py", "method.py", "registry", "sentence_cap.yaml"} <= set(second)
    assert "samplers=(" in second["registry"]


def install_first_example(tmp_path: Path, monkeypatch) -> Path:
    """The page's first example as a user adds it: the package, the registry line (with the package's import path
    where the test put it), the YAML; returns the YAML's path."""
    blocks = doc_blocks()
    write_package(tmp_path / "plugins", "length_penalty", {f: blocks[f] for f in ("config.py", "method.py")},
                  "GRPO with a length penalty (docs/adding-a-method.md).")
    monkeypatch.syspath_prepend(str(tmp_path / "plugins"))
    name, entry = registry_line(blocks["registry"], registry.MethodEntry,
                                {"slime_ext.methods.length_penalty": "length_penalty"})
    monkeypatch.setitem(registry.METHODS, name, entry)
    yaml_text = blocks["length_penalty.yaml"].replace("extends: grpo.yaml", f"extends: {CONFIGS / 'grpo.yaml'}")
    (tmp_path / "length_penalty.yaml").write_text(yaml_text)
    return tmp_path / "length_penalty.yaml"


def test_the_first_method_is_built_from_its_yaml_and_scores_by_the_page(tmp_path, monkeypatch):
    """The default run's variant of the job below (slow; the second example's job runs by default): the page's
    blocks registered as a user would, its YAML composed and validated, the method built through the registry; on
    one group of a correct 6-token and a wrong 12-token response its rewards, advantages and metric are the
    page's formula, computed by hand. A section the schema did not pick up or a hook that is not called fails."""
    from slime_ext.config import load_config
    from slime_ext.data import Sample
    from slime_ext.orchestration.local_endpoints import build_run_method

    config_path = install_first_example(tmp_path, monkeypatch)
    cfg = load_config(config_path, ["rollout.max_response_len=24"]).config
    assert cfg.method == "length_penalty" and cfg.length_penalty.coef == 0.2
    with pytest.raises(ValueError, match="length_penalty is written for the math reward"):
        load_config(config_path, ["reward.type=code"])
    method = build_run_method(cfg)
    assert type(method).__name__ == "LengthPenaltyGRPO"
    group = [Sample("right", [3, 4], list(range(6)), group_id="g", label="3", response_text="so \\boxed{3}"),
             Sample("wrong", [3, 4], list(range(12)), group_id="g", label="3", response_text="so \\boxed{4}")]
    metrics = method.finish([group], 0)
    penalties = [0.2 * 6 / 24, 0.2 * 12 / 24]  # 0.05, 0.1
    assert [s.rewards["length_penalty"] for s in group] == pytest.approx(penalties, abs=1e-12)
    assert [s.reward for s in group] == pytest.approx([1 - 0.05, 0 - 0.1], abs=1e-12)
    assert metrics["length_penalty/mean"] == pytest.approx(0.075, abs=1e-12)
    assert group[0].advantage > 0 > group[1].advantage and group[0].advantage == pytest.approx(-group[1].advantage)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_method_added_as_the_page_says_runs_two_rl_steps(tmp_path, monkeypatch, job_cache):
    from slime_ext.orchestration.driver import main

    install_first_example(tmp_path, monkeypatch)
    # the method lives in this process's sys.path, so the rollout manager runs in the driver
    rc = main([str(tmp_path / "length_penalty.yaml"), f"run.output_dir={tmp_path / 'runs'}",
               f"run.cache_dir={job_cache}", "rollout.manager=driver", *TINY])
    assert rc == 0
    (run_dir,) = (tmp_path / "runs").iterdir()
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1]
    n = 4 * 8
    for r in rows:
        assert r["length_penalty/mean"] == pytest.approx(0.2 * r["response_len/mean"] / 24, rel=1e-9)
        correct = (r["reward/mean"] + r["length_penalty/mean"]) * n
        assert correct == pytest.approx(round(correct), abs=1e-6) and 0 <= round(correct) <= n
    assert "coef: 0.2" in (run_dir / "config.yaml").read_text()


def install_second_example(tmp_path: Path, monkeypatch) -> Path:
    """The page's second example as a user adds it: the sampler file, the package, the registry line, the YAML;
    here in a directory on sys.path and PYTHONPATH (the engine processes import the sampler by its name)."""
    blocks = doc_blocks(1)
    plugins = tmp_path / "plugins"
    write_package(plugins, "sentence_cap", {f: blocks[f] for f in ("config.py", "method.py")},
                  "GRPO with a sentence cap (docs/adding-a-method.md).")
    (plugins / "sentence_cap_sampler.py").write_text(blocks["sentence_cap.py"])
    monkeypatch.syspath_prepend(str(plugins))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(plugins), os.environ.get("PYTHONPATH", "")]))
    name, entry = registry_line(blocks["registry"], registry.MethodEntry,
                                {"slime_ext.methods.sentence_cap": "sentence_cap",
                                 "sglang_patches.sentence_cap": "sentence_cap_sampler"})
    monkeypatch.setitem(registry.METHODS, name, entry)
    config = tmp_path / "sentence_cap.yaml"
    config.write_text(blocks["sentence_cap.yaml"].replace("extends: grpo.yaml", f"extends: {CONFIGS / 'grpo.yaml'}"))
    return config


@pytest.mark.timeout(900)
@pytest.mark.parametrize("engine", [pytest.param("embedded", marks=pytest.mark.slow), "sglang"])
def test_a_method_with_a_sampler_runs_on_each_engine(tmp_path, monkeypatch, engine, job_cache):
    """Two RL steps of the second example; every response holds at most max_sentences sentence ends, one the
    cap ended holds exactly that many, and the cap ended some: the sampler ran where the tokens were chosen."""
    from slime_ext.orchestration.driver import main
    from slime_ext.tokenizer import load_tokenizer

    config = install_second_example(tmp_path, monkeypatch)
    from sentence_cap.method import SENTENCE_ENDS, SentenceCapGRPO

    seen: list[tuple[list[int], str]] = []  # every rollout the method finished: response ids, finish reason
    finish = SentenceCapGRPO.finish

    def recording_finish(self, groups, step):
        seen.extend((list(s.response_ids), s.metadata.get("finish_reason")) for g in groups for s in g)
        return finish(self, groups, step)

    monkeypatch.setattr(SentenceCapGRPO, "finish", recording_finish)
    extra = ["rollout.engine=sglang", "sglang.num_engines=1"] if engine == "sglang" else []
    rc = main([str(config), f"run.output_dir={tmp_path / 'runs'}", f"run.cache_dir={job_cache}",
               "rollout.manager=driver", *TINY, *extra])
    assert rc == 0
    (run_dir,) = (tmp_path / "runs").iterdir()
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1]
    tok = load_tokenizer(json.loads((run_dir / "summary.json").read_text())["stages"]["tokenizer"]["path"])
    ends = {i for i in range(len(tok)) if tok.decode([i]).strip().endswith(SENTENCE_ENDS)}
    assert len(seen) == 2 * 4 * 8 and ends
    capped = 0
    for ids, reason in seen:
        n_ends = sum(t in ends for t in ids)
        assert n_ends <= 1, (ids, reason)
        if reason == "sampler":
            capped += 1
            assert n_ends == 1, ids
    assert capped > 0 and capped == round(sum(r["sentence_cap/capped"] for r in rows) * 4 * 8)
