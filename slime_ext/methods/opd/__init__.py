"""On-policy distillation: a teacher scores the student's own rollouts token by token (docs/methods/opd.md)."""
