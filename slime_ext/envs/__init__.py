"""Environments for multi-turn rollouts: the interface (`base.py`), the registry (`registry.py`), the token-in,
token-out episode loop (`rollout.py`), and the built-in `tools` environment with its tools. See
docs/environments.md."""
