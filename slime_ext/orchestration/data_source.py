"""Deterministic prompt order across epochs, resumable from a two-number state."""

from __future__ import annotations

import random
from typing import Any


class DataSource:
    """Yields prompt rows in a seeded per-epoch permutation; `state_dict` is (epoch, offset)."""

    def __init__(self, rows: list[dict], seed: int, shuffle: bool = True):
        if not rows:
            raise ValueError("the training data source has no rows")
        self.rows, self.seed, self.shuffle = rows, seed, shuffle
        self.epoch, self.offset = 0, 0
        self._order = self._permutation(0)

    def _permutation(self, epoch: int) -> list[int]:
        order = list(range(len(self.rows)))
        if self.shuffle:
            random.Random(f"data:{self.seed}:{epoch}").shuffle(order)
        return order

    def next_batch(self, n: int) -> list[dict]:
        out = []
        while len(out) < n:
            if self.offset == len(self._order):
                self.epoch += 1
                self.offset = 0
                self._order = self._permutation(self.epoch)
            out.append(self.rows[self._order[self.offset]])
            self.offset += 1
        return out

    def state_dict(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "offset": self.offset}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.epoch, self.offset = int(state["epoch"]), int(state["offset"])
        self._order = self._permutation(self.epoch)
