"""Task family v2: synthetic math stories of 2 to 10 steps, varied phrasing, an optional re-check tail.

Levels ``V2``..``V10`` (the number is the number of steps); the rows go through the same loader, verifier and
``data.source: synthetic_math`` path as v1 (`slime_ext.tasks.synthetic_math` dispatches on the level name),
and the exact solver (`solver.py`, DA-GRPO's embedded cloud) reads their stories.
See docs/tasks.md, "Task family v2".
"""
