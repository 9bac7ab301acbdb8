"""Tandem RL's evaluation axes (the Tandem RL paper, section 4; docs/methods/tandem.md), beyond solo pass@k.

- Handoff robustness: senior and junior take turns continuing the same token prefix, one reasoning
  step (up to the data's step separator, `data.synthetic.step_separator`: `\\n\\n` on v1's paragraph
  configs, a line on task v2) per turn, strictly alternating (senior first) or by a fair coin per step; the
  team's final answer is scored (pass@k). Both are engines with prefix reuse, so a turn costs only its
  new tokens: the cached-token share is reported.
- Drift: marginal token distributions of senior vs junior solo generations (signed log-ratio per
  token, full-vocabulary KL, survival curve of |log-ratio| over the junior's frequent tokens), beside the
  same numbers for the junior against itself sampled with other seeds: the floor that sampling alone gives.
- Legibility: the junior's per-token cross-entropy on the senior's outputs (teacher forced) and the
  overlap `sum_v min(p_s(v|ctx), p_j(v|ctx))` averaged over those positions.
"""

from __future__ import annotations

import json
import logging
import math
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import torch

from sglang_patches.request_sampler import CoinStream
from sglang_patches.decoding import SamplingParams
from slime_ext.algo import pass_at_k
from slime_ext.data.generation import GenerateRequest
from slime_ext.rewards import get_verifier
from slime_ext.tasks.templates import get_template

STEP_END = "\n\n"  # the default turn end: v1's paragraph-separated steps


@dataclass
class TeamRollout:
    prompt_index: int
    output_ids: list[int]
    senior_tokens: int
    junior_tokens: int
    turns: int
    correct: float = 0.0
    turn_authors: list = None  # "senior" / "junior" per turn
    turn_lengths: list = None  # tokens written per turn

    def __post_init__(self) -> None:
        self.turn_authors = list(self.turn_authors or [])
        self.turn_lengths = list(self.turn_lengths or [])

    @property
    def senior_share(self) -> float:
        total = self.senior_tokens + self.junior_tokens
        return self.senior_tokens / total if total else float("nan")


def team_rollouts(senior: Any, junior: Any, prompts: Sequence[list[int]], n_samples: int, schedule: str,
                  max_new_tokens: int, eos_token_id: int, seed: int = 0, temperature: float = 1.0,
                  step_end: str = STEP_END, progress: Callable[[str], None] | None = None,
                  ) -> tuple[list[TeamRollout], dict[str, float]]:
    """Generate `n_samples` team responses per prompt, one reasoning step per turn.

    `schedule`: "alternate" (senior, junior, senior, ...) or "bernoulli" (each step's author drawn
    with P(senior) = 0.5 from a per-rollout coin stream); a turn ends at `step_end`. Each turn is one batched
    `generate` call per engine over the rollouts whose turn it is. Returns the rollouts and the engines' cache accounting.
    `progress(msg)` hears each turn's start (a 1026-prompt x 8 evaluation runs ~10 minutes per schedule on 2 CPUs).
    """
    if schedule not in ("alternate", "bernoulli"):
        raise ValueError(f"unknown handoff schedule {schedule!r}; expected alternate or bernoulli")
    rollouts = [TeamRollout(i, [], 0, 0, 0) for i in range(len(prompts)) for _ in range(n_samples)]
    coins = [CoinStream(seed, f"handoff-{k}") for k in range(len(rollouts))]
    active = list(range(len(rollouts)))
    cached = fed = 0
    turn = 0
    while active:
        by_engine: dict[str, list[int]] = {"senior": [], "junior": []}
        for k in active:
            senior_turn = (turn % 2 == 0) if schedule == "alternate" else coins[k].bernoulli(0.5)
            by_engine["senior" if senior_turn else "junior"].append(k)
        if progress is not None:
            progress(f"turn {turn}: {len(active)} of {len(rollouts)} rollouts unfinished "
                     f"({len(by_engine['senior'])} senior, {len(by_engine['junior'])} junior)")
        still = []
        for name, engine in (("senior", senior), ("junior", junior)):
            ks = by_engine[name]
            if not ks:
                continue
            requests = []
            for k in ks:
                r = rollouts[k]
                budget = max_new_tokens - len(r.output_ids)
                sp = SamplingParams(temperature=temperature, max_new_tokens=budget, stop=[step_end])
                requests.append(GenerateRequest(f"team{k}-t{turn}", list(prompts[r.prompt_index]) + r.output_ids, sp,
                                                seed=seed * 1_000_003 + k * 1009 + turn, return_logprob=False))
            for k, req, res in zip(ks, requests, engine.generate(requests)):
                r = rollouts[k]
                r.output_ids.extend(res.output_ids)
                r.turns += 1
                r.turn_authors.append(name)
                r.turn_lengths.append(len(res.output_ids))
                if name == "senior":
                    r.senior_tokens += len(res.output_ids)
                else:
                    r.junior_tokens += len(res.output_ids)
                cached += res.cached_tokens
                fed += len(req.input_ids)
                done = (not res.output_ids or res.output_ids[-1] == eos_token_id or res.finish_reason != "stop"
                        or len(r.output_ids) >= max_new_tokens)
                if not done:
                    still.append(k)
        active = sorted(still)
        turn += 1
    return rollouts, {"cached_token_share": cached / max(fed, 1), "fed_tokens": float(fed),
                      "cached_tokens": float(cached), "turns": float(turn)}


def handoff_eval(senior: Any, junior: Any, tokenizer: Any, rows: Sequence[dict], n_samples: int, ks: Sequence[int],
                 schedule: str, max_new_tokens: int, template: str = "plain", reward_type: str = "math",
                 seed: int = 0, step_end: str = STEP_END, progress: Callable[[str], None] | None = None,
                 ) -> dict[str, Any]:
    """Team pass@k under a handoff schedule, with per-rollout senior shares and cache accounting."""
    fmt = get_template(template)
    prompts = [tokenizer(fmt.format(r["prompt"]))["input_ids"] for r in rows]
    rollouts, cache = team_rollouts(senior, junior, prompts, n_samples, schedule, max_new_tokens,
                                    tokenizer.eos_token_id, seed, step_end=step_end, progress=progress)
    verify = get_verifier(reward_type)
    for r in rollouts:
        text = tokenizer.decode(r.output_ids, skip_special_tokens=True)
        r.correct = float(verify(text, rows[r.prompt_index]["label"]).score)
    per_prompt = [[r for r in rollouts if r.prompt_index == i] for i in range(len(rows))]
    out: dict[str, Any] = {"schedule": schedule, "n_prompts": len(rows), "n_samples": n_samples}
    for k in ks:
        out[f"pass@{k}"] = sum(pass_at_k(n_samples, int(sum(x.correct for x in g)), k) for g in per_prompt) / len(rows)
    out["mean_correct"] = sum(r.correct for r in rollouts) / len(rollouts)
    # per prompt, in row order: what a study pairs prompt by prompt between two models' handoff evaluations
    out["correct_per_prompt"] = [int(sum(x.correct for x in g)) for g in per_prompt]
    shares = [r.senior_share for r in rollouts if not math.isnan(r.senior_share)]
    out["senior_share_mean"] = sum(shares) / max(len(shares), 1)
    out["senior_share_per_rollout"] = [round(s, 4) for s in shares]
    out["turns_mean"] = sum(r.turns for r in rollouts) / len(rollouts)
    out.update(cache)
    return out


# -- drift ----------------------------------------------------------------------------------------
def token_drift(senior_outputs: Sequence[Sequence[int]], junior_outputs: Sequence[Sequence[int]], vocab_size: int,
                min_junior_count: int = 20, smoothing: float = 0.5) -> dict[str, Any]:
    """Marginal token distributions of the two models' generations, compared.

    p(v) = (count(v) + smoothing) / (N + smoothing * V) for each side; `log_ratio[v] = log p_s - log p_j`;
    KL(p_s || p_j) over the full vocabulary; survival curve: for tokens the junior emits at least
    `min_junior_count` times, the fraction whose |log_ratio| exceeds each threshold.
    """
    cs, cj = Counter(t for o in senior_outputs for t in o), Counter(t for o in junior_outputs for t in o)
    ns, nj = sum(cs.values()), sum(cj.values())
    if ns == 0 or nj == 0:
        raise ValueError("token drift needs non-empty senior and junior generations")
    ids = torch.arange(vocab_size)
    ps = (torch.tensor([cs.get(int(v), 0) for v in ids], dtype=torch.float64) + smoothing) / (ns + smoothing * vocab_size)
    pj = (torch.tensor([cj.get(int(v), 0) for v in ids], dtype=torch.float64) + smoothing) / (nj + smoothing * vocab_size)
    log_ratio = (ps.log() - pj.log())
    frequent = [v for v, c in cj.items() if c >= min_junior_count]
    thresholds = [0.0, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0]
    abs_lr = log_ratio[frequent].abs() if frequent else torch.zeros(0, dtype=torch.float64)
    survival = [float((abs_lr > x).double().mean()) if frequent else float("nan") for x in thresholds]
    top = torch.argsort(log_ratio[frequent].abs(), descending=True)[:10].tolist() if frequent else []
    return {
        "kl_senior_junior": float((ps * (ps.log() - pj.log())).sum()),
        "survival_thresholds": thresholds,
        "survival": survival,
        "n_frequent_tokens": len(frequent),
        "most_drifted": [(int(frequent[i]), float(log_ratio[frequent[i]])) for i in top],
        "senior_tokens": ns,
        "junior_tokens": nj,
    }


# -- legibility -----------------------------------------------------------------------------------
@torch.no_grad()
def legibility(senior_model: torch.nn.Module, junior_model: torch.nn.Module, prompts: Sequence[list[int]],
               outputs: Sequence[list[int]], batch_size: int = 16) -> dict[str, float]:
    """Junior per-token cross-entropy on the senior's outputs, and the mean per-position overlap
    `sum_v min(p_s, p_j)` of the two next-token distributions (both teacher forced)."""
    ce_sum = overlap_sum = 0.0
    n = 0
    pairs = [(p, o) for p, o in zip(prompts, outputs) if o]
    for start in range(0, len(pairs), batch_size):
        chunk = pairs[start : start + batch_size]
        width = max(len(p) + len(o) for p, o in chunk)
        ids = torch.zeros(len(chunk), width, dtype=torch.long)
        attn = torch.zeros(len(chunk), width, dtype=torch.long)
        for b, (p, o) in enumerate(chunk):
            seq = list(p) + list(o)
            ids[b, : len(seq)] = torch.tensor(seq)
            attn[b, : len(seq)] = 1
        lp_s = torch.log_softmax(senior_model(ids, attention_mask=attn).logits.float(), -1)
        lp_j = torch.log_softmax(junior_model(ids, attention_mask=attn).logits.float(), -1)
        for b, (p, o) in enumerate(chunk):
            pos = torch.arange(len(p) - 1, len(p) - 1 + len(o))
            tgt = torch.tensor(o)
            ce_sum += float(-lp_j[b, pos, tgt].sum())
            overlap_sum += float(torch.minimum(lp_s[b, pos].exp(), lp_j[b, pos].exp()).sum(-1).sum())
            n += len(o)
    if n == 0:
        raise ValueError("legibility needs at least one non-empty senior output")
    return {"junior_ce_on_senior": ce_sum / n, "overlap": overlap_sum / n, "tokens": float(n)}


def solo_outputs(engine: Any, prompts: Sequence[list[int]], n_samples: int, max_new_tokens: int,
                 seed: int = 0, tag: str = "solo") -> list[list[int]]:
    """n sampled responses per prompt (temperature 1), in prompt-major order."""
    sp = SamplingParams(temperature=1.0, max_new_tokens=max_new_tokens)
    reqs = [GenerateRequest(f"{tag}{i}-{j}", list(p), sp, seed=seed * 7919 + i * 31 + j, return_logprob=False)
            for i, p in enumerate(prompts) for j in range(n_samples)]
    out: list[list[int]] = []
    for start in range(0, len(reqs), 256):
        out.extend(r.output_ids for r in engine.generate(reqs[start : start + 256]))
    return out


def survival_plot(drift_by_method: dict[str, dict[str, Any]], path: Any) -> None:
    """Survival curves of |log-ratio| (one line per method) as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 3.5))
    for name, d in drift_by_method.items():
        ax.plot(d["survival_thresholds"], d["survival"], marker="o", label=name)
    ax.set_xlabel("|log p_senior(v) - log p_junior(v)|")
    ax.set_ylabel("share of junior-frequent tokens above")
    ax.set_title("Token drift from the junior")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def axes_settings(cfg: Any) -> Any:
    """The run config's `tandem_axes` section, or its defaults when the method's config has none."""
    settings = getattr(cfg, "tandem_axes", None)
    if settings is not None:
        return settings
    from slime_ext.methods.tandem.config import TandemAxesConfig

    return TandemAxesConfig()


def step_separator(cfg: Any) -> str:
    """Where a handoff turn ends: the data's step separator (v1's paragraph configs: a blank line)."""
    synthetic = getattr(getattr(cfg, "data", None), "synthetic", None)
    return getattr(synthetic, "step_separator", None) or STEP_END


def tandem_axes(senior_dir: str, junior_dir: str, tokenizer: Any, rows: Sequence[dict], cfg: Any,
                n_prompts: int, load_engine: Callable[[str], Any], progress: Any = None) -> dict[str, Any]:
    """All of Tandem's non-solo axes for a senior checkpoint against its junior (both HF dirs).

    `load_engine(dir)` gives an in-process engine with `.model` (the caller's embedded engine: tiny models);
    `progress(msg)` is called between the parts. Team rollouts per prompt and the pass@k values come from the
    config's `tandem_axes` section (`n_samples`, `k`; else `eval.n_samples` / `eval.k`).
    """
    say = progress or (lambda msg: None)
    settings = axes_settings(cfg)
    rows = list(rows)[:n_prompts]
    senior = load_engine(str(senior_dir))
    junior = load_engine(str(junior_dir))
    common = dict(n_samples=settings.samples(cfg), ks=settings.ks(cfg), max_new_tokens=cfg.rollout.max_response_len,
                  template=cfg.data.template, reward_type=cfg.reward.type, seed=cfg.run.seed,
                  step_end=step_separator(cfg))
    out: dict[str, Any] = {"senior": str(senior_dir), "junior": str(junior_dir), "n_prompts": len(rows),
                           "step_end": common["step_end"]}
    for schedule in ("alternate", "bernoulli"):
        say(f"handoff ({schedule}) on {len(rows)} prompts x {common['n_samples']}")
        out[f"handoff_{schedule}"] = handoff_eval(senior, junior, tokenizer, rows, schedule=schedule, progress=say,
                                                  **common)
    fmt = get_template(cfg.data.template)
    prompts = [tokenizer(fmt.format(r["prompt"]))["input_ids"] for r in rows]
    say("solo generations of senior and junior (drift, legibility), and the junior again with other seeds")
    s_out = solo_outputs(senior, prompts, 2, cfg.rollout.max_response_len, seed=cfg.run.seed, tag="s")
    j_out = solo_outputs(junior, prompts, 2, cfg.rollout.max_response_len, seed=cfg.run.seed, tag="j")
    # the floor: the junior against itself, sampled with seeds no other draw here uses
    j_again = solo_outputs(junior, prompts, 2, cfg.rollout.max_response_len, seed=cfg.run.seed + 1_000_003, tag="jj")
    vocab = len(tokenizer)
    out["drift"] = token_drift(s_out, j_out, vocab_size=vocab)
    out["drift_floor"] = token_drift(j_again, j_out, vocab_size=vocab)
    say("legibility (teacher-forced junior on senior outputs)")
    out["legibility"] = legibility(senior.model, junior.model, [p for p in prompts for _ in range(2)], s_out)
    return out


def axes_row(axes: dict[str, Any]) -> dict[str, float]:
    """The headline numbers of `tandem_axes` for a results table."""
    a, b = axes["handoff_alternate"], axes["handoff_bernoulli"]
    k = max(int(key.split("@")[1]) for key in a if key.startswith("pass@"))
    return {
        f"handoff_alt_pass@{k}": a[f"pass@{k}"], "handoff_alt_mean": a["mean_correct"],
        "handoff_alt_senior_share": a["senior_share_mean"],
        f"handoff_bern_pass@{k}": b[f"pass@{k}"], "handoff_bern_mean": b["mean_correct"],
        "handoff_cached_share": a["cached_token_share"],
        "drift_kl": axes["drift"]["kl_senior_junior"],
        **({"drift_kl_floor": axes["drift_floor"]["kl_senior_junior"]} if "drift_floor" in axes else {}),
        "drift_share_gt_0.2": axes["drift"]["survival"][axes["drift"]["survival_thresholds"].index(0.2)],
        "junior_ce_on_senior": axes["legibility"]["junior_ce_on_senior"],
        "overlap": axes["legibility"]["overlap"],
    }


def final_evaluation(method: Any, final_dir: Path, start_dir: Path, run_dir: Path, eval_rows: list[dict],
                     load_engine: Callable[[str], Any]) -> None:
    """The registry's after-training evaluation (any GRPO-family method whose entry declares the `tandem_axes`
    section, when `tandem_axes.enabled`): handoff robustness, drift and legibility of the trained model against
    the junior, into `tandem_axes.json` and `plots/drift_survival.png`."""
    settings = getattr(method.config, "tandem_axes", None)
    if settings is None or not settings.enabled:
        return
    if settings.junior_path:  # the same junior for every arm of a study, the GRPO baseline's included
        from slime_ext.methods.tandem.method import checked_junior

        junior = checked_junior(settings.junior_path, method.tokenizer, "tandem_axes.junior_path")
    else:
        junior = method.partner_dir(start_dir) or method.kl_reference_dir(start_dir) or start_dir
    log = logging.getLogger(__name__)
    axes = tandem_axes(str(final_dir), str(junior), method.tokenizer, eval_rows, method.config,
                       n_prompts=settings.prompts, load_engine=load_engine,
                       progress=lambda m: log.info("tandem axes: %s", m))
    (run_dir / "tandem_axes.json").write_text(json.dumps(axes, indent=2) + "\n")
    (run_dir / "plots").mkdir(exist_ok=True)
    survival_plot({method.name: axes["drift"]}, run_dir / "plots" / "drift_survival.png")


def checkpoint_evaluation(checkpoint: Path, junior_dir: str, tokenizer: Any, rows: Sequence[dict], cfg: Any,
                          out: Path, load_engine: Callable[[str], Any]) -> None:
    """`eval_checkpoint --tandem-junior HF_DIR`: Tandem's axes (handoff, drift, legibility) of the checkpoint
    against that junior, into `<out stem>_tandem_axes.json` beside the evaluation, and printed. The number of
    prompts, team rollouts and pass@k values are the run config's `tandem_axes` keys (their defaults when that
    method's config has no such section)."""
    log = logging.getLogger(__name__)
    settings = axes_settings(cfg)
    axes = tandem_axes(str(checkpoint), junior_dir, tokenizer, rows, cfg, n_prompts=settings.prompts,
                       load_engine=load_engine, progress=lambda m: log.info("tandem axes: %s", m))
    axes_out = out.with_name(out.stem + "_tandem_axes.json")
    axes_out.write_text(json.dumps(axes, indent=2) + "\n")
    print("\n".join(f"{k}: {v:.4f}" for k, v in axes_row(axes).items()))
    print(f"wrote {axes_out}")
