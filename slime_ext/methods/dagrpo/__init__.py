"""DA-GRPO: when to ask a cloud model, under a usage budget held by a dual variable (and its baselines)."""
