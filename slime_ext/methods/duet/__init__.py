"""DUET: a per-step token budget, Neyman allocation, marker-gated abort, unbiasing weights."""
