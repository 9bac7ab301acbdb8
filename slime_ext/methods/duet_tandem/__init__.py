"""DUET on Tandem rollouts (composition of the two packages)."""
