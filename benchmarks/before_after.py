"""Run one benchmark's child mode in a fresh subprocess that imports the project from a given tree.

The before/after benchmarks (shared_prompt_kv.py, handoff_eval.py) compare a checkout of an earlier commit
(`git worktree add --detach /tmp/before <commit>`) with this one: each side is the same script's `--child` run
with PYTHONPATH and the working directory set to its tree, and reports one JSON line, to which the tree's
commit and whether it had uncommitted changes are added.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path


def git_state(tree: Path) -> dict:
    """The tree's commit and whether tracked files differ from it."""
    def git(*args: str) -> str:
        done = subprocess.run(["git", "-C", str(tree), *args], capture_output=True, text=True, check=False)
        return done.stdout.strip()

    return {"commit": git("rev-parse", "HEAD"), "dirty": bool(git("status", "--porcelain", "--untracked-files=no"))}


def run_side(script: str, tree: Path, child_args: list[str], threads: int) -> dict:
    """`python script --child --tree TREE child_args...` importing from `tree`; its last stdout line as JSON."""
    cmd = [sys.executable, script, "--child", "--tree", str(tree), *child_args]
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), PYTHONPATH=str(tree))
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=tree, check=False)
    if proc.returncode:
        raise RuntimeError(f"{tree}: exit {proc.returncode}\n{proc.stderr[-3000:]}")
    return {**json.loads(proc.stdout.strip().splitlines()[-1]), **git_state(tree)}
