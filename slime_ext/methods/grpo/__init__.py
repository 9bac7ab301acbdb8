"""GRPO: the group-relative baseline every method builds on."""
