"""Reading and summarising study runs: per-prompt evaluation records, paired and across-seed intervals.

Why a package module rather than code in each `results/<study>/analyze.py`: every study compares arms the same
way (paired over held-out prompts within a seed, a t interval over seeds across them), and the numbers in the
docs must all mean the same thing.
"""

from slime_ext.studies.records import (RUN_FILES, keep_run_files, kept_copy, kept_run, level_key, per_level_table,
                                      per_prompt_scores, read_metrics, read_records)
from slime_ext.studies.stats import ci_text, min_detectable_difference, paired_over_prompts, t_interval

__all__ = ["RUN_FILES", "ci_text", "keep_run_files", "kept_copy", "kept_run", "level_key", "min_detectable_difference",
           "paired_over_prompts", "per_level_table", "per_prompt_scores", "read_metrics", "read_records", "t_interval"]
