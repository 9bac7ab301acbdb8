"""Every method's rollout step through engine servers, compared with the in-process engine.

Each method (GRPO, DAPO, Tandem, DUET, DUET on Tandem, SxS RL, DA-GRPO) runs one rollout step, two where
its controllers act on the second (DUET's allocation and K1/K2 window, DA-GRPO's lambda), with the same
config, rows and seeds
(a) through `RolloutManager` over the in-process `EmbeddedEngine` (senior + junior partner), and
(b) through `RolloutManager` over a `ServerEnginePool` of two `python -m slime_ext.tools.serve` processes,
    each started with `--partner` = the junior (Tandem's pair served together), with `rollout.engine:
    sglang` (Tandem then sends `tokenizer_path` instead of boundary ids) and the client replaying the
    per-token annotations from the returned ids.
The configs differ only in `rollout.engine`. One tiny random MoE pair and one tokenizer serve every
method: two tokens are added to the trained tokenizer and their output rows scaled up so that the
methods' branches fire, `\\boxed{3}` (DUET's math marker, hence trims, and a correct answer on the rows
labelled 3) and DA-GRPO's help trigger (asks, answered by the in-process `solver:` cloud endpoint and
spliced); the SxS tag rows are scaled too, so that think and speak blocks open and close. `_coverage`
checks that each branch fired. Before every step both engines get the checkpoint's weights again, as the
loop's sync does (the embedded engine flushes its prefix cache; the pool moves to version `step`, which
the rollout manager checks, and flushes too).

Bit-identical between the paths (asserted with ==): response ids, every per-token annotation
(`metadata["annotations"]`: Tandem authors and draws, DUET marker / abort / keep propensity, SxS
channels, DA-GRPO's asked flag), the fields the methods derive from them (`author`, `channel`,
`loss_mask`, `weight`, `cost`, DA-GRPO's spliced `response_ids` with the cloud's tokens masked), finish
reasons ("sampler" included, see below), status, response text, rewards, advantages, every step metric
that depends neither on logprobs nor on wall time, and the controllers' state after the run.

Not bit-identical, and why:
- logprobs: equal within 2e-4 (asserted; 0.02% on a PPO ratio). Measured over repeated runs: max |diff|
  1.4e-5..6e-5 per method, relative to |logprob| at most 1.6e-5; only 11-28% of tokens have bit-identical
  logprobs. The tokens agree because every row samples with its own generator seeded from the request
  seed, but the float32 logits depend on the batch a row is computed in: the servers batch concurrent
  HTTP requests as they arrive (a 5 ms window per engine, the pool sending whole prompt groups to the
  less loaded of two engines), where the in-process step is one `generate` call over all requests; on
  CPU the batch shape changes the rounding (rows per GEMM, the padded width, tokens routed to each MoE
  expert), and a prompt prefilled from the prefix cache takes another path than one prefilled whole.
  Not specific to the servers: the embedded engine alone differs by up to 3e-5 between one call and
  per-group calls, and between 4 and 8 rows of one prompt (no padding involved); it is bit-identical
  only for the same batch (row order does not matter). Since the batches depend on arrival timing, the
  logprob differences vary from run to run. A token would differ only if its uniform draw fell within
  ~1e-5 of a CDF boundary: none did in 16.8k tokens compared across batchings, nor in any run here.
  DUET's sigma_q (std of A x the sum of a rollout's logprobs) inherits the difference: its state and
  `duet/lambda` (after the first step) are compared with rel 1e-4.
- `metadata["cached_tokens"]`: 0 in-process (each prompt is prefilled once per call, the cache is
  flushed before each step); through the servers a step's requests reach an engine in several batches
  and later ones reuse the prefixes earlier ones cached (the prompt group's, or the template's shared
  "Question: " prefix), so the servers report > 0. It changes the cost, not the results.
- `metadata["weight_version"]` / `["served_by"]` and the metrics `rollout/weight_version_*` and
  `rollout/engines_used`: servers only (None / absent in-process). `time/*`, `perf/*`: wall clock.
Finish reason "sampler" (a sampler forced EOS: DUET's abort and trim, DA-GRPO's trigger) came back as
"stop" through the server before this test (SGLang's schema has no such type). DUET counts only "stop"
ends as natural lengths, so its K1/K2 refit after step 0 differed (K1 9 vs 17 here) and step 1 rolled out
other tokens. The server now adds `"sampler": true` to that stop finish_reason and the client maps it
back (`slime_ext/serving/native_routes.py`, `SGLangEngineClient._parse`); a real SGLang server still
reports such an EOS as a plain matched stop.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, fields
from typing import Any

import pytest
import torch

from slime_ext.config import load_config
from slime_ext.data import Sample
from tests.conftest import CONFIGS

MARKER = "\\boxed{3}"
TRIGGER = "I need external assistance."  # DA-GRPO's default trigger
LOGPROB_TOL = 2e-4  # absolute, per token (measured up to 6e-5)
# DUET's per-prompt signal is a std of A x sum(logprobs) (up to 32 tokens): it carries their rounding
DERIVED_REL_TOL = 1e-4
LOGPROB_DERIVED_METRICS = {"duet/lambda"}
SERVER_ONLY_METRICS = {"rollout/engines_used", "rollout/weight_version_min", "rollout/weight_version_max"}
SERVER_ONLY_METADATA = {"cached_tokens", "weight_version", "served_by"}


@dataclass(frozen=True)
class Case:
    config: str
    overrides: tuple[str, ...] = ()
    steps: int = 1


# run.seed=4: a data order and request seeds under which every method's branches fire (`_coverage`)
COMMON = ("rollout.prompts_per_step=4", "rollout.n_samples_per_prompt=4", "rollout.max_response_len=32",
          "run.seed=4")
# a gate scaled to 32-token responses (K1/K2 start at 9/22), refit after every step, and both outcomes of
# the abort coin
DUET = ("duet.grace=4", "duet.poll=2", "duet.refit_every=1", "duet.eps_abort=0.5", "duet.budget_fraction=1.0")
CASES = {
    "grpo": Case("grpo.yaml"),
    "dapo": Case("dapo.yaml", ("dapo.overlong_buffer=8", "train.global_batch_size=8")),
    "tandem": Case("tandem.yaml", ("tandem.kappa=4",)),
    "duet": Case("duet.yaml", DUET, steps=2),
    "duet_tandem": Case("duet_tandem.yaml", DUET + ("tandem.kappa=4",), steps=2),
    "sxs_rl": Case("sxs_rl.yaml"),
    "dagrpo": Case("dagrpo.yaml", ("dagrpo.phases=[]", "dagrpo.lambda_init=0.5", "dagrpo.eta_lambda=0.5"), steps=2),
}


@dataclass
class Models:
    senior: str
    junior: str
    tokenizer: Any
    rows: list[dict]
    named: list[tuple[str, torch.Tensor]]  # the senior checkpoint's weights (re-synced before every step)


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> Models:
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    from slime_ext.tasks.synthetic_math import generate_dataset
    from slime_ext.tokenizer import load_tokenizer, train_tokenizer
    from tests.megatron_fixtures import tiny_moe_config

    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("server_path")
    rows = generate_dataset(["L1"], 8, seed=0, split="train")
    tok = train_tokenizer([r["prompt"] + "\n" + r["solution"] for r in rows] * 5, vocab_size=320)
    tok.add_tokens([MARKER, TRIGGER])
    senior, junior = root / "senior", root / "junior"
    scaled = {tok.convert_tokens_to_ids(MARKER): 2.0, tok.convert_tokens_to_ids(TRIGGER): 3.0}
    scaled.update({i: 3.0 for i in tok.convert_tokens_to_ids(["<think>", "</think>", "<speak>", "</speak>"])})
    for seed, d in ((0, senior), (1, junior)):
        tok.save_pretrained(d)
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(tiny_moe_config(vocab_size=len(tok), initializer_range=0.5,
                                                                 max_position_embeddings=512))
        with torch.no_grad():
            for i, factor in scaled.items():
                model.lm_head.weight[i] *= factor
        model.save_pretrained(d)
    # half the rows answer 3, so the marker token is a correct answer there: rewards and advantages vary
    rows = [dict(r, row_id=i, label="3" if i % 2 == 0 else r["label"]) for i, r in enumerate(rows)]
    named = sorted(load_file(str(senior / "model.safetensors")).items())
    return Models(str(senior), str(junior), load_tokenizer(senior), rows, named)


@pytest.fixture(scope="module")
def local(models):
    from slime_ext.engine.embedded import EmbeddedEngine

    return EmbeddedEngine.from_pretrained(models.senior, partner_path=models.junior)


@pytest.fixture(scope="module")
def pool(models, tmp_path_factory):
    from slime_ext.config.sections import SGLangConfig
    from slime_ext.engine.engine_server import EngineServerActor
    from slime_ext.engine.server_pool import ServerEnginePool

    cfg = SGLangConfig(num_engines=2, max_restarts=0, startup_timeout_s=120, request_timeout_s=120)
    logs = tmp_path_factory.mktemp("engine_logs")
    actors = [EngineServerActor(i, cfg, models.senior, partner_dir=models.junior, log_dir=str(logs)) for i in range(2)]
    try:
        # started from this thread: the servers get SIGTERM when the thread that started them ends
        urls = [a.start() for a in actors]
        tok = models.tokenizer
        yield ServerEnginePool(actors, urls, cfg, str(tmp_path_factory.mktemp("weights")), client_kwargs={
            "eos_token_id": tok.eos_token_id, "tokenizer_path": models.senior, "vocab_size": len(tok),
            "native_partner": True})
    finally:
        for a in actors:
            a.stop()


def _config(case: Case, models: Models, engine: str) -> Any:
    overrides = [*COMMON, *case.overrides, f"model.hf_path={models.senior}", f"rollout.engine={engine}"]
    return load_config(CONFIGS / case.config, overrides).config


def _run(case: Case, models: Models, engine_kind: str, engine: Any) -> tuple[list[tuple[list[Sample], dict]], Any]:
    """The method's steps through the rollout manager: (samples, metrics) per step, and the method."""
    from slime_ext.engine.weight_sync import LocalWeightSource
    from slime_ext.orchestration.rollout_manager import RolloutManager

    manager = RolloutManager(_config(case, models, engine_kind), models.rows, models.tokenizer, engine)
    steps = []
    for step in range(case.steps):
        if engine_kind == "sglang":
            engine.sync_weights(LocalWeightSource(models.named), step)  # the loop's sync: version `step`, caches flushed
        else:
            engine.update_weights_from_tensor(models.named)  # the embedded actor's sync: same weights, flushed
        groups, metrics = manager.rollout(step)
        metrics.update(manager.update({}, step))
        steps.append(([s for g in groups for s in g], metrics))
    return steps, manager.method


def _close(a: Any, b: Any, rel: float) -> bool:
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return a == pytest.approx(b, rel=rel, abs=0) if isinstance(a, float) else a == b


def _compare_samples(a: Sample, b: Sample) -> tuple[float, int]:
    """Assert everything but logprobs bit-identical; returns (max |logprob diff|, bit-identical logprobs)."""
    for f in fields(Sample):
        if f.name in ("logprobs", "metadata"):
            continue
        assert getattr(a, f.name) == getattr(b, f.name), (a.sample_id, f.name, getattr(a, f.name), getattr(b, f.name))
    meta_a = {k: v for k, v in a.metadata.items() if k not in SERVER_ONLY_METADATA}
    meta_b = {k: v for k, v in b.metadata.items() if k not in SERVER_ONLY_METADATA}
    assert meta_a == meta_b, (a.sample_id, meta_a, meta_b)
    assert b.metadata["weight_version"] is not None and b.metadata["served_by"]
    assert len(a.logprobs) == len(b.logprobs) == a.response_len
    diffs = [abs(x - y) for x, y in zip(a.logprobs, b.logprobs)]
    assert max(diffs, default=0.0) <= LOGPROB_TOL, (a.sample_id, max(diffs))
    return max(diffs, default=0.0), sum(d == 0.0 for d in diffs)


def _coverage(name: str, steps: list[tuple[list[Sample], dict]]) -> None:
    """The comparison is only worth something if the method's branches fired."""
    samples = [s for step, _ in steps for s in step]
    notes = [n for s in samples for n in s.metadata["annotations"]]
    if "tandem" in name:
        assert {n["author"] for n in notes} == {0, 1} and any(0 < sum(s.author) < s.response_len for s in samples)
    if "duet" in name:
        meta = [s.metadata for s in samples]
        assert any(m["did_abort"] for m in meta) and any(m["eps_kept"] for m in meta)
        trimmed = [s for s in samples if s.metadata["marker_at"] is not None and s.metadata["finish_reason"] == "sampler"]
        assert trimmed, "no rollout was trimmed after its marker"
    if name == "sxs_rl":
        assert {c for s in samples for c in s.channel} == {0, 1}
    if name == "dagrpo":
        asked = [s for s in samples if s.cost]
        assert asked and len(asked) < len(samples)
        answered = [s for s in asked if 2 in s.author]  # a cloud completion spliced in (masked)
        assert answered
        for s in answered:  # the engine's ids up to the trigger (its forced EOS dropped), then the cloud's
            local = len(s.metadata["annotations"]) - 1
            assert s.author == [1] * local + [2] * (s.response_len - local)
            assert s.loss_mask == [1.0] * local + [0.0] * (s.response_len - local)
        assert steps[1][1]["dagrpo/lambda"] != steps[0][1]["dagrpo/lambda"]
    assert len({s.reward for s in samples}) > 1  # rewards, hence advantages, vary


@pytest.mark.parametrize("name", list(CASES))
def test_a_rollout_step_through_the_servers_matches_the_in_process_engine(name, models, local, pool):
    case = CASES[name]
    t0 = time.perf_counter()
    ours, method_a = _run(case, models, "embedded", local)
    t1 = time.perf_counter()
    theirs, method_b = _run(case, models, "sglang", pool)
    t2 = time.perf_counter()
    worst, identical, tokens, samples = 0.0, 0, 0, 0
    for step, ((sa, ma), (sb, mb)) in enumerate(zip(ours, theirs)):
        assert [s.sample_id for s in sa] == [s.sample_id for s in sb]
        for a, b in zip(sa, sb):
            diff, same = _compare_samples(a, b)
            worst, identical = max(worst, diff), identical + same
            tokens, samples = tokens + a.response_len, samples + 1
        assert set(mb) - set(ma) == SERVER_ONLY_METRICS
        for key, value in ma.items():
            if key.startswith(("time/", "perf/")):
                continue
            rel = DERIVED_REL_TOL if key in LOGPROB_DERIVED_METRICS else 0.0
            assert _close(value, mb[key], rel), (step, key, value, mb[key])
    _coverage(name, ours)
    state_a, state_b = method_a.state_dict(), method_b.state_dict()
    if "duet" in name:  # sigma_q is a std of A x sum(logprobs); lengths, window and floor are exact
        sigma_a, sigma_b = state_a["stats"].pop("sigma"), state_b["stats"].pop("sigma")
        assert sigma_a.keys() == sigma_b.keys()
        assert all(sigma_a[k][1] == sigma_b[k][1] and _close(sigma_a[k][0], sigma_b[k][0], DERIVED_REL_TOL)
                   for k in sigma_a)
        assert _close(state_a.pop("lam"), state_b.pop("lam"), DERIVED_REL_TOL)
    assert state_a == state_b
    # what the module docstring reports (shown with `pytest -s`)
    print(f"\n{name}: {samples} samples, {tokens} tokens, bit-identical logprobs {identical}/{tokens}, "
          f"max |logprob diff| {worst:.2e}; in-process {t1 - t0:.2f} s, servers {t2 - t1:.2f} s")
