"""Worked examples read from the docs and the tiny job every end-to-end doc test runs them with."""

from __future__ import annotations

import re
from pathlib import Path


def fenced_blocks(text: str, entry_marker: str) -> dict[str, str]:
    """The fenced code blocks of `text`, keyed by the file named (in backticks) on the line before each; the
    block containing `entry_marker` (a registry line, e.g. "MethodEntry(") is keyed 'registry'."""
    out = {}
    for match in re.finditer(r"(?P<before>[^\n]*)\n\n```(?P<lang>\w+)\n(?P<body>.*?)```", text, re.S):
        before, body = match["before"], match["body"]
        named = re.search(r"`([\w/.]+\.(?:py|yaml))`", before)
        if entry_marker in body:
            out["registry"] = body
        elif named:
            out[Path(named[1]).name] = body
    return out


def tiny_job(n_samples: int, max_response_len: int) -> list[str]:
    """Overrides for a job of a few seconds per stage: a small model, 10 SFT steps, 2 RL steps."""
    return [
        "data.synthetic.n_train=300", "data.synthetic.n_eval=8", "tokenizer.n_training_texts=300",
        "model.hidden_size=64", "model.num_layers=2", "model.moe_intermediate_size=64", "model.intermediate_size=128",
        "rollout.prompts_per_step=4", f"rollout.n_samples_per_prompt={n_samples}",
        f"rollout.max_response_len={max_response_len}", "train.micro_batch_size=16", "sft.steps=10",
        "sft.batch_size=16", "train.steps=2", "run.stages=[data,tokenizer,sft,rl]",
    ]


def write_package(root: Path, name: str, files: dict[str, str], doc: str = "") -> None:
    """A package `name` under `root` holding `files` (file name -> text), importable once `root` is on sys.path."""
    package = root / name
    package.mkdir(parents=True, exist_ok=True)
    (package / "__init__.py").write_text(f'"""{doc}"""\n' if doc else "")
    for file, text in files.items():
        (package / file).write_text(text)


def registry_line(block: str, entry_class: type, renames: dict[str, str]) -> tuple[str, object]:
    """(name, entry) of a doc's one registry line `"name": Entry(...),`, with the import paths the test moved
    (`renames`: the doc's path -> the test's) replaced."""
    name, text = re.match(rf'\s*"(\w+)":\s*({entry_class.__name__}\(.*\)),\s*$', block.strip("\n")).groups()
    for old, new in renames.items():
        text = text.replace(old, new)
    return name, eval(text, {entry_class.__name__: entry_class})  # noqa: S307 (our own docs)
