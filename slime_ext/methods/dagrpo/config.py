"""The `dagrpo` config section."""

from __future__ import annotations

from typing import Any, Optional

from pydantic import Field, model_validator

from slime_ext.config.sections import V2_LEVEL_NAMES, ConfigCheckError, Section, SyntheticLevel, refuse_deep_staleness


class DAGRPOPhase(Section):
    name: str
    # any synthetic level: the exact solver behind `solver:` cloud URLs (`solve_story`) reads both families
    levels: list[SyntheticLevel] = Field(default_factory=lambda: ["L2"], min_length=1)
    train_path: Optional[str] = None
    eval_path: Optional[str] = None
    steps: int = Field(100, ge=0)
    tau: float = Field(0.2, ge=0, le=1)
    tau_schedule: Optional[list[tuple[int, float]]] = None  # (step within phase, tau) points
    step_limit: int = Field(4, ge=1)  # the format rule's most `Step k:` lines (core.format_ok)

    @model_validator(mode="after")
    def _check_step_limit(self) -> "DAGRPOPhase":
        """A v2 level's references have exactly as many steps as its name says (V6: 6): below that, every
        full solution, the reference's included, would be scored as badly formatted. (v1 levels vary in
        length and their names do not say it, so they are not checked here.)"""
        longest = max((int(lvl[1:]) for lvl in self.levels if lvl in V2_LEVEL_NAMES), default=0)
        if not self.train_path and longest > self.step_limit:
            raise ConfigCheckError(
                f"dagrpo phase {self.name!r}: step_limit = {self.step_limit} but its level V{longest} has {longest} "
                f"steps, so every full solution would break the format rule; set step_limit to at least {longest}",
                ("step_limit", "levels"))
        return self


class DAGRPOConfig(Section):
    """DA-GRPO's settings (docs/methods/dagrpo.md)."""

    trigger: str = "I need external assistance."
    lambda_init: float = Field(0.0, ge=0)
    eta_lambda: float = Field(0.05, ge=0)
    cloud_url: Optional[str] = None
    cloud_timeout_s: float = Field(30.0, gt=0)
    cloud_retries: int = Field(3, ge=0)
    cloud_concurrency: int = Field(4, ge=1)
    # Circuit breaker (slime_ext.clients.circuit_breaker): after this many failed attempts in a row the
    # cloud is not called for the cool-down; the calls it skips count as unanswered requests.
    cloud_breaker_failures: int = Field(5, ge=1)
    cloud_breaker_cooldown_s: float = Field(60.0, gt=0)
    # A step (or phase evaluation) whose share of failed or skipped cloud calls exceeds this logs a warning
    # and sets `dagrpo/cloud_degraded`.
    cloud_failure_warn_rate: float = Field(0.2, ge=0, le=1)
    phases: list[DAGRPOPhase] = Field(default_factory=list)
    hierarchical_reward: float = Field(0.2, ge=0, le=1)  # collab_grpo baseline's fixed assistance reward
    require_tags: bool = False  # format rule: <think>..</think><answer>..</answer> (off for the synthetic task)
    badly_formatted_reward: float = Field(0.5, ge=0, le=1)  # correct but badly formatted
    # Share of SFT solutions that stop after their first step with the trigger (the warm start asks
    # for help sometimes, so the behaviour exists before RL); SFT draws from every phase's data.
    sft_trigger_fraction: float = Field(0.15, ge=0, le=1)
    # Local-only tuning baseline: no trigger, no cloud; the same phases and evaluation.
    local_only: bool = False
    # The phase evaluations also sample one answer per prompt at eval.temperature (keys `sampled/...`): the cloud
    # rate of the policy as it is sampled in training, beside the greedy answers' (the default evaluation).
    eval_sampled: bool = False

    def check_run(self, config: Any) -> None:
        """The phases run back to back (the RL steps must be exactly their steps), a run that may ask
        needs somewhere to send the question (only the local-only baseline never calls the cloud), and a
        multi-turn run asks through the `cloud` tool (the trigger sampler cannot span turns)."""
        refuse_deep_staleness(config, config.method, "dual variable (the usage budget's price in the advantage)")
        self._check_tool_path(config)
        if self.phases:
            if config.data.synthetic.train_level_weights is not None:
                raise ConfigCheckError(
                    "data.synthetic.train_level_weights weights the levels of data.synthetic.train_levels, but "
                    "dagrpo.phases sets each phase's levels, in equal shares: remove the weights, or drop dagrpo.phases "
                    "to train on the weighted pool",
                    ("data.synthetic.train_level_weights", "dagrpo.phases"))
            total = sum(p.steps for p in self.phases)
            if total != config.train.steps:
                raise ConfigCheckError(
                    f"train.steps ({config.train.steps}) must equal the sum of dagrpo.phases[*].steps "
                    f"({' + '.join(str(p.steps) for p in self.phases)} = {total}); set both together",
                    ("train.steps", "dagrpo.phases"))
        if not self.local_only and not (self.cloud_url or "").strip():
            raise ConfigCheckError(
                f"method {config.method} needs dagrpo.cloud_url (an OpenAI-compatible endpoint, e.g. python -m "
                "slime_ext.tools.serve --model STRONGER_MODEL, or solver:synthetic_math_answer); only "
                "dagrpo.local_only=true runs without one", ("dagrpo.cloud_url",))

    def _check_tool_path(self, config: Any) -> None:
        """With `rollout.env` the model asks by calling the `cloud` tool of the `tools` environment (the
        trigger is a per-request sampler, whose state would restart every turn): the tool must be offered,
        except to the local-only baseline, which must not offer it."""
        env = config.rollout.env
        if env is None:
            return
        if env != "tools":
            raise ConfigCheckError(
                f"method {config.method} with rollout.env = {env!r}: in multi-turn episodes DA-GRPO asks the cloud "
                "through the `cloud` tool of the `tools` environment (rollout.env=tools, rollout.env_settings.tools "
                "offering cloud); its trigger sampler cannot span turns", ("rollout.env",))
        offered = config.rollout.offered_tools()
        if self.local_only and "cloud" in offered:
            raise ConfigCheckError(
                f"dagrpo.local_only = true but rollout.env_settings.tools = {offered} offers cloud: the local-only "
                "baseline never asks; remove cloud from the tools", ("dagrpo.local_only", "rollout.env_settings.tools"))
        if not self.local_only and "cloud" not in offered:
            raise ConfigCheckError(
                f"method {config.method} with rollout.env = tools needs the cloud tool, but rollout.env_settings.tools "
                f"= {offered}: the model could never ask (its trigger sampler cannot span turns); add cloud "
                "(configs/dagrpo_tools.yaml), or set dagrpo.local_only=true", ("rollout.env_settings.tools",))
