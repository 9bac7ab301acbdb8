"""DA-GRPO's reward, cost, dual advantage, dual update and the splice of the cloud's completion.

- Reward on the composed response: 1 if correct and well formatted, `badly_formatted_reward` if correct
  but badly formatted, 0 if wrong. Format: `Step k:` lines numbered 1, 2, ... and at most the task's
  step limit, a boxed answer, and (when `require_tags`) `<think>...</think>` before `<answer>...</answer>`.
- Cost c = 1 if the cloud was used (asked), else 0.
- Dual advantage per group: A = (r - mean r) - lambda (c - mean c), then GRPO's std normalisation
  (switchable); lambda shapes the reward, it does not scale the gradient.
- Projected dual update: lambda <- max(0, lambda + eta (C_hat - tau)).
- Splice: the training sequence keeps the local tokens (the trigger included: asking is the decision
  being learned; trained) followed by the cloud's tokens (masked, author EXTERNAL); the verifier scores
  the text with the cloud's completion in place of the trigger.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Optional, Sequence

import numpy as np

_STEP_LINE = re.compile(r"(?:^|<think>)\s*Step (\d+):", re.MULTILINE)


def format_ok(text: str, step_limit: int, require_tags: bool = True) -> bool:
    steps = [int(x) for x in _STEP_LINE.findall(text)]
    if not steps or steps != list(range(1, len(steps) + 1)) or len(steps) > step_limit:
        return False
    if "\\boxed{" not in text:
        return False
    if require_tags:
        t0, t1, a0, a1 = (text.find(x) for x in ("<think>", "</think>", "<answer>", "</answer>"))
        if min(t0, t1, a0, a1) < 0 or not t0 < t1 <= a0 < a1:
            return False
    return True


def composed_reward(correct: bool, well_formatted: bool, badly_formatted_reward: float = 0.5) -> float:
    if not correct:
        return 0.0
    return 1.0 if well_formatted else float(badly_formatted_reward)


def dual_advantages(rewards: Sequence[float], costs: Sequence[float], group_ids: Sequence[Any], lam: float,
                    normalize_std: bool = True, eps: float = 1e-6) -> np.ndarray:
    """A = (r - mean_G r) - lambda (c - mean_G c), divided by the group's (n - 1) std of r - lambda c when
    normalising (the GRPO core's convention). A group whose shaped rewards r - lambda c tie gets 0 (as the
    GRPO core): rounding noise over a zero std must not become an advantage."""
    r, c = np.asarray(rewards, dtype=np.float64), np.asarray(costs, dtype=np.float64)
    out = np.zeros_like(r)
    groups: dict[Any, list[int]] = {}
    for i, g in enumerate(group_ids):
        groups.setdefault(g, []).append(i)
    for idx in groups.values():
        shaped = r[idx] - lam * c[idx]
        if len(idx) <= 1 or _ties(r[idx], lam * c[idx], shaped):
            continue  # a group of one, or without variance, has nothing to compare with (as the GRPO core)
        a = (r[idx] - r[idx].mean()) - lam * (c[idx] - c[idx].mean())
        if normalize_std:  # the GRPO core's convention: unbiased (n - 1) std of the group
            a = a / (np.std(shaped, ddof=1) + eps)
        out[idx] = a
    return out


def _ties(r: np.ndarray, lam_c: np.ndarray, shaped: np.ndarray) -> bool:
    """Whether the shaped rewards r - lambda c are equal up to the rounding of that subtraction (a few
    ulps of the operands): 0.7 - 0.3 x 1 is 0.39999999999999997, not 0.4, yet the group has no signal."""
    scale = max(float(np.abs(r).max()), float(np.abs(lam_c).max()))
    return float(shaped.max() - shaped.min()) <= 4 * np.finfo(np.float64).eps * scale


def dual_update(lam: float, cloud_rate: float, tau: float, eta: float) -> float:
    """One projected dual-ascent step on lambda (kept >= 0)."""
    return max(0.0, float(lam) + float(eta) * (float(cloud_rate) - float(tau)))


def tau_at(step_in_phase: int, tau: float, schedule: Optional[Sequence[Sequence[float]]] = None) -> float:
    """The phase's target at a step: `schedule` points (step, tau) switch tau from that step on."""
    current = float(tau)
    for start, value in sorted(schedule or [], key=lambda p: p[0]):
        if step_in_phase >= start:
            current = float(value)
    return current


@dataclass
class Splice:
    response_ids: list[int]  # local tokens (with the trigger) + cloud tokens
    loss_mask: list[float]  # 1 local, 0 cloud
    author: list[int]  # 1 local (POLICY), 2 cloud (EXTERNAL)
    scored_text: str  # what the verifier sees: the cloud's completion in place of the trigger


def splice(local_ids: Sequence[int], local_text: str, trigger: str, cloud_text: Optional[str], tokenizer: Any,
           eos_token_id: int) -> Splice:
    """Compose a help-seeking response with the cloud's completion (None = the call failed: nothing is
    spliced and the request counts as unanswered)."""
    ids = [t for t in local_ids if t != eos_token_id]
    head, found, _ = local_text.rpartition(trigger)
    if not found:
        raise ValueError(f"splice: the response does not contain the trigger {trigger!r}")
    if cloud_text is None:
        return Splice(list(ids), [1.0] * len(ids), [1] * len(ids), head)
    cloud_ids = list(tokenizer(cloud_text)["input_ids"]) + [eos_token_id]
    return Splice(ids + cloud_ids, [1.0] * len(ids) + [0.0] * len(cloud_ids), [1] * len(ids) + [2] * len(cloud_ids),
                  head + cloud_text)


def spliced_routing(routed_experts: Any, prompt_len: int, local_ids: Sequence[int], eos_token_id: int,
                    new_response_len: int) -> Any:
    """Routing replay after `splice`: the local tokens it keeps keep the engine's routing; the cloud tokens
    (never fed to the policy engine) and a kept token the engine never fed (its last) get -1, so the
    trainer's router chooses for them. None stays None. [prompt_len + new_response_len - 1, layers, top_k]."""
    from slime_ext.data.sample import splice_routed_experts

    kept = list(range(prompt_len)) + [prompt_len + i for i, t in enumerate(local_ids) if t != eos_token_id]
    return splice_routed_experts(routed_experts, kept, prompt_len + new_response_len)


def with_trigger_examples(rows: Sequence[dict], trigger: str, fraction: float, seed: int = 0,
                          tool: Optional[str] = None) -> list[dict]:
    """SFT rows where a deterministic `fraction` of solutions stop after their first step with the trigger,
    so the local model asks for help sometimes before RL (the behaviour RL then prices with lambda).

    `tool` (the cloud as a tool): the solution asks by calling that tool with the trigger as its argument, reads
    the cloud's answer as the environment's observation and writes it as its final line. The answer shown is
    the reference's answer line (`\\boxed{N}`: what `solver:synthetic_math_answer` answers), not a v2
    reference's re-check tail after it; the SFT builder gives the observation loss mask 0
    (`slime_ext.tasks.response_tokens`)."""
    import hashlib

    out = []
    for row in rows:
        key = hashlib.blake2b(f"{seed}:{row.get('id', row['prompt'])}".encode(), digest_size=8).digest()
        if int.from_bytes(key, "little") / 2**64 < fraction and row.get("solution"):
            lines = str(row["solution"]).split("\n")
            row = dict(row, solution=asking_solution(lines[0], trigger, answer_line(str(row["solution"])), tool))
        out.append(row)
    return out


def answer_line(solution: str) -> str:
    """The last line of a reference up to its answer: a task family v2 reference may end with a re-check tail
    (``Check: ... \\boxed{N}``, `slime_ext.tasks.v2.recheck`) after its ``\\boxed{N}`` line; v1's end there."""
    from slime_ext.tasks.v2.recheck import split_tail

    return split_tail(solution)[0].rsplit("\n", 1)[-1]


def asking_solution(first: str, trigger: str, final: str, tool: Optional[str] = None) -> str:
    """A warm-start solution that asks after its first line: the trigger (splice path), or a call of `tool`,
    the cloud's answer `final` as its observation, and `final` written by the model (tool path)."""
    if tool is None:
        return f"{first}\n{trigger}"
    from slime_ext.envs.tool_call import format_call, format_observation

    return f"{first}\n{format_call(tool, trigger)}{format_observation(final, False)}{final}"
