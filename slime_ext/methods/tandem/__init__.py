"""Tandem RL: a trained senior and a frozen junior co-generate; GRPO on the senior's tokens (and its KL-Reg baseline, its evaluation axes)."""
