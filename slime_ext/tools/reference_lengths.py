"""Reference lengths per level of a synthetic-task config, in the tokens of the run's tokenizer and in the run's
own data format: the configured method's row transform applies (SxS's interleaved or restated formats, Tandem's
paragraphs), to the measured rows and to the embedded tokenizer's training texts, as the driver applies it.

Why: `rollout.max_response_len` must hold the longest reference, and a study sizes its runs by these lengths; a
table measured without the method's format would understate them (the SxS formats run ~1.6x CoT's).

    python -m slime_ext.tools.reference_lengths configs/grpo_v2.yaml [key=value ...] [--per-level 200]
    python -m slime_ext.tools.reference_lengths SXS_V2.yaml tokenizer.path=COT_RUN/hf --per-level 114

(SXS_V2.yaml: `extends: [configs/sxs_sft.yaml, configs/tasks/v2.yaml]`; `tokenizer.path` measures in another run's
tokens, as the SxS study's shared CoT tokenizer.)
"""

from __future__ import annotations

import argparse
import sys
from typing import Sequence

from slime_ext.config import load_config
from slime_ext.methods.registry import data_transform
from slime_ext.tasks.v2.measure import format_table, level_lengths, measured_rows, pipeline_tokenizer

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> int:
    """CLI: the markdown table of `level_lengths` for `--per-level` eval rows of each of the config's eval levels."""
    p = argparse.ArgumentParser(prog="python -m slime_ext.tools.reference_lengths", description=__doc__.splitlines()[0])
    p.add_argument("config")
    p.add_argument("overrides", nargs="*")
    p.add_argument("--per-level", type=int, default=200)
    p.add_argument("--cache-dir", default=None, help="default: the config's run.cache_dir")
    args = p.parse_args(argv)
    cfg = load_config(args.config, args.overrides).config
    transform = data_transform(cfg)
    tokenizer = pipeline_tokenizer(cfg, args.cache_dir or cfg.run.cache_dir, transform)
    rows = measured_rows(cfg, args.per_level, transform)
    print(format_table(level_lengths(rows, tokenizer, cfg.data.template)))
    print(f"# tokenizer: {len(tokenizer)} tokens; {args.per_level} eval rows per level, seed {cfg.data.synthetic.seed}",
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
