"""The hooks every training method implements, and what the loop asks of a method.

Per step (the data flow of one RL step):
    plan(prompts, step)  -> how to roll out each prompt (samples, sampler specs, sampling params)
    finish(groups)       -> score, advantages, masks, weights on the finished rollouts (in place)
    update(stats)        -> controller updates after the optimizer step (DUET windows, DA-GRPO lambda)

Per run (the loop, the engine and the trainer know no method by name; they ask these):
    loss_spec()                -> the trainer's clip epsilons, KL coefficient / estimator, aggregation
                                  (at setup, and each step with the rollout: it travels with the batch)
    needs_partner (class)      -> the engine holds a second, partner model (Tandem's junior)
    holds_partner(config)      -> ... for this config (on-policy distillation: only the embedded engine does)
    scoring_servers(config)    -> engine servers of their own that score the sampled tokens (a teacher), which
                                  the plan places and counts and the job starts; scoring_model() on the engine
    partner_dir / kl_reference_dir -> which checkpoints those are
    warm_start_rows / warm_start_key -> what the SFT warm start trains on and what its cache key includes
    eval_options / evaluate_after_step / final_evaluations -> what a method adds to evaluation
    env_tools()                -> the tool objects it lends to a multi-turn `tools` environment (its registry
                                  entry's `tools`), for the rollouts and the episode evaluations

None of them knows which engine or trainer host runs the step. Controller state is saved with
checkpoints (`state_dict`), so a resumed run continues exactly. A run has one method object; during RL the
rollout manager holds it (`slime_ext.orchestration.training_job.TrainingJob` says who asks what, when), so
a method must pickle (it is handed to the manager actor).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

from sglang_patches.decoding import SamplingParams
from slime_ext.algo import LossSpec
from slime_ext.data import Sample


@dataclass(frozen=True)
class ScoringServers:
    """Engine servers a method needs beside the rollout engines, serving a fixed checkpoint that only scores
    (prefill-only logprobs of the sampled tokens; no weight sync): `num_engines` servers of `tp_size` GPUs,
    on GPUs of their own (`placement: own`) or on the rollout engines' (`colocated`). `shape_config`: a model
    YAML fragment with the checkpoint's architecture, for a plan made where the checkpoint is absent."""

    checkpoint: str
    num_engines: int
    tp_size: int
    placement: str  # own | colocated
    mem_fraction_static: float
    shape_config: Optional[str] = None
    key: str = ""  # the config key that names the checkpoint, for messages
    size_keys: str = ""  # the keys that set num_engines x tp_size, for messages
    placement_key: str = ""
    mem_key: str = ""


@dataclass
class PromptPlan:
    """How to roll out one prompt: `n` samples with these sampler specs and sampling parameters."""

    n: int
    sampling: SamplingParams
    sampler_specs: list[dict[str, Any]] = field(default_factory=list)


class Method:
    name = "base"
    train_kind = "grpo"  # which trainer loss the method's batches use
    data_epoch = 0  # the data source's epoch, set by the rollout manager before each step
    needs_partner = False  # the engine must hold a partner model beside the policy (Tandem's junior)

    def __init__(self, config: Any, tokenizer: Optional[Any] = None):
        self.config = config
        self.tokenizer = tokenizer

    # -- data ----------------------------------------------------------------------------------------
    def data_phase(self) -> Optional[str]:
        """Name of the data phase to draw from (continual methods); None = the run's training data."""
        return None

    def phase_train_rows(self, name: str) -> list[dict]:
        raise NotImplementedError(f"method {self.name!r} has no data phases")

    def prompts_to_draw(self, prompts_per_step: int) -> int:
        """How many prompts to roll out this step (DAPO oversamples)."""
        return prompts_per_step

    # -- one RL step ---------------------------------------------------------------------------------
    def plan(self, prompts: list[dict], step: int) -> list[PromptPlan]:
        raise NotImplementedError

    def finish(self, groups: list[list[Sample]], step: int) -> dict[str, float]:
        raise NotImplementedError

    def update(self, stats: dict[str, float], step: int) -> dict[str, float]:
        return {}

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass

    # -- what the loop, the engine and the trainer need ----------------------------------------------
    def loss_spec(self) -> LossSpec:
        """The policy loss the trainer runs for this method's batches (the shared `grpo` section). Asked at
        setup and again with every rollout, so a spec that follows the controllers' state is applied step by step."""
        g = self.config.grpo
        return LossSpec(eps_clip_low=g.eps_clip_low, eps_clip_high=g.eps_clip_high, kl_coef=g.kl_coef,
                        kl_estimator=g.kl_estimator, entropy_coef=g.entropy_coef, loss_agg=g.loss_agg)

    def scoring_model(self) -> Optional[str]:
        """An engine model ("partner") whose logprob of every sampled token the rollout manager attaches to each
        sample (`metadata["scored_logprobs"]`) before `finish`; None: nothing is scored."""
        return None

    @classmethod
    def holds_partner(cls, config: Any) -> bool:
        """Whether the rollout engines hold the partner model for this config (plan and job ask the class)."""
        return cls.needs_partner

    @classmethod
    def scoring_servers(cls, config: Any) -> Optional[ScoringServers]:
        """Engine servers of their own that score the sampled tokens (None: the engine scores, if anything)."""
        return None

    def partner_dir(self, start_dir: Path) -> Optional[Path]:
        """The partner model the engine loads beside the policy (only when `needs_partner`)."""
        return None

    def kl_reference_dir(self, start_dir: Path) -> Optional[Path]:
        """The KL reference model when it is not the run's starting checkpoint."""
        return None

    def warm_start_rows(self, train_rows: list[dict], seed: int) -> list[dict]:
        """The rows the SFT warm start trains on."""
        return train_rows

    def warm_start_key(self) -> Any:
        """What, besides the shared settings, the warm start's cache key must include (JSON-able)."""
        return None

    def eval_options(self) -> dict[str, Any]:
        """Extra keyword arguments of `slime_ext.evaluation.evaluate` (sampler specs, a projection of the
        response before scoring, per-response metrics). By default: the per-response metrics the method's
        registry entry names (`response_metrics`)."""
        from slime_ext.methods import registry

        metrics = registry.response_metrics(self.name)
        if metrics is None:
            return {}
        tokenizer = self.tokenizer
        return {"response_metrics": lambda result: metrics(tokenizer, result.output_ids)}

    def env_tools(self) -> dict[str, Any]:
        """The tools this method lends to the run's `tools` environment: its registry entry's `tools`, each built
        once per process as `Class(self)` (they share the method's state, e.g. a client and its counts of the
        step). The rollout manager and the episode evaluations hand them to the environment they build."""
        from slime_ext.methods import registry

        built = self.__dict__.get("_env_tools")
        if built is None:
            built = {name: registry.load_object(path)(self) for name, path in registry.method_tools(self.name).items()}
            self._env_tools = built
        return built

    def evaluate_after_step(self, row: dict[str, float], engine: Any, run_dir: Path) -> None:
        """Evaluation the method runs between steps (DA-GRPO: after each continual phase); it runs in the
        rollout manager, which holds the method during RL, with the manager's engine."""

    def final_evaluations(self, final_dir: Path, start_dir: Path, run_dir: Path, eval_rows: list[dict],
                          load_engine: Callable[[str], Any]) -> None:
        """Evaluation the method adds after training (written into the run directory); `load_engine(dir)`
        gives an in-process engine over an HF checkpoint. By default: the evaluations the method's registry
        entry names, in order."""
        from slime_ext.methods import registry

        for evaluation in registry.evaluations(self.name):
            evaluation(self, final_dir, start_dir, run_dir, eval_rows, load_engine)
