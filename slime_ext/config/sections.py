"""The run-wide config sections (run, model, data, rollout, train, GRPO core, eval, cluster).

Each method's own section lives in its package (`slime_ext/methods/<name>/config.py`); a run's config holds
these sections plus its own method's (its registry entry's `sections`, composed by slime_ext.config.schema).
A YAML file only states what it changes; every model forbids unknown keys so a typo fails loudly instead of
silently running defaults.
"""

from __future__ import annotations

import typing
from typing import Any, ClassVar, Literal, Optional

import json
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

# The synthetic task's difficulty levels (slime_ext.tasks.synthetic_math.ALL_LEVELS: the curriculum L0-L5, the
# tools task's T1-T2, then task family v2's V2-V10; a test keeps the two equal). Named here because the config
# may not import the task code, and a typo must fail at `--check`. StoryLevel: the v1 family (one step phrasing,
# the form `solution_tool` rewrites); V2Level: task family v2. The exact solver (`solve_story`, DA-GRPO's
# `solver:` cloud) reads both.
StoryLevel = Literal["L0", "L1", "L2", "L3", "L4", "L5", "T1", "T2"]
V2Level = Literal["V2", "V3", "V4", "V5", "V6", "V7", "V8", "V9", "V10"]
SyntheticLevel = Literal[StoryLevel, V2Level]
V2_LEVEL_NAMES: frozenset[str] = frozenset(typing.get_args(V2Level))
# The share of v2 references with a re-check tail when data.synthetic.recheck_share is null
# (slime_ext.tasks.v2.recheck.DEFAULT_RECHECK_SHARE; a test keeps the two equal).
DEFAULT_RECHECK_SHARE = 0.25


class ConfigCheckError(ValueError):
    """A check across keys failed. `keys` (dotted, relative to the section that raises) lets the loader
    name the file or command-line override that set them."""

    def __init__(self, message: str, keys: tuple[str, ...] = ()):
        super().__init__(message)
        self.keys = tuple(keys)


def refuse_deep_staleness(config: Any, method: str, controller: str) -> None:
    """A method whose controller is updated after every step and shapes the next rollouts' plans runs with
    rollout.max_staleness 0 or 1 only: with K > 1 the plans of K queued rollouts would all come from a
    controller K steps old, which the method's control (and its tests) do not account for."""
    k = config.rollout.max_staleness
    if k > 1:
        raise ConfigCheckError(
            f"rollout.max_staleness = {k} with method {method!r}: its {controller} is updated after every step and "
            f"plans the rollouts started after it, so with K > 1 every queued rollout would be planned by a "
            "controller up to K steps old, which the method's control does not account for; set "
            "rollout.max_staleness to 0 or 1", ("rollout.max_staleness", "method"))


class Section(BaseModel):
    """Base for every config section: unknown keys are errors, assignments are validated, and no float
    may be NaN or infinite (`.inf` is valid YAML, and a run with an infinite temperature or lr fails
    late or, worse, not at all)."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)

    def check_run(self, config: Any) -> None:
        """Checks across sections, run when the configured method uses this section (raise ValueError)."""

    def data_transform(self, config: Any) -> Any:
        """A function that rewrites synthetic data rows, when this section asks for one (else None). Its
        import path (or a `cache_key` attribute) keys the prepared data and the SFT warm start."""
        return None


class RunConfig(Section):
    name: str = "run"
    output_dir: str = "runs"
    cache_dir: str = ".cache/slime_ext"
    seed: int = Field(0, ge=0)
    resume: Optional[str] = None
    # Which stages of the main job run, in order. Later issues add stages; unknown ones are rejected.
    stages: list[Literal["data", "tokenizer", "check_references", "sft", "rl", "eval"]] = Field(
        default_factory=lambda: ["data", "tokenizer", "check_references", "sft", "rl", "eval"]
    )
    log_every: int = Field(10, ge=1)  # a one-line metrics summary in the log every N RL steps (the bar shows each)
    save_every: int = Field(1, ge=1)  # every step: a killed run loses at most the step in flight


class ModelConfig(Section):
    """Architecture of the policy; mirrors the fields of an HF Qwen3 / Qwen3-MoE config."""

    name: str = "tiny-qwen3-moe"
    arch: Literal["qwen3", "qwen3_moe"] = "qwen3_moe"
    hf_path: Optional[str] = None  # an HF checkpoint dir; when set its config.json wins over fields below
    vocab_size: Optional[int] = Field(None, ge=1)  # None: taken from the tokenizer
    hidden_size: int = Field(128, ge=1)
    num_layers: int = Field(4, ge=1)
    num_attention_heads: int = Field(4, ge=1)
    num_key_value_heads: int = Field(2, ge=1)
    head_dim: int = Field(32, ge=1)
    intermediate_size: int = Field(512, ge=1)  # dense FFN width (dense layers / dense model)
    num_experts: int = Field(8, ge=0)
    num_experts_per_tok: int = Field(2, ge=1)
    moe_intermediate_size: int = Field(256, ge=1)
    rope_theta: float = Field(1_000_000.0, gt=0)
    rms_norm_eps: float = Field(1e-6, gt=0)
    max_position_embeddings: int = Field(2048, ge=16)
    tie_word_embeddings: bool = False
    router_aux_loss_coef: float = Field(0.001, ge=0)

    @model_validator(mode="after")
    def _check_heads(self) -> "ModelConfig":
        if self.num_attention_heads % self.num_key_value_heads != 0:
            raise ConfigCheckError(
                f"num_attention_heads ({self.num_attention_heads}) must be a multiple of "
                f"num_key_value_heads ({self.num_key_value_heads})", ("num_attention_heads", "num_key_value_heads")
            )
        if self.arch == "qwen3_moe" and self.num_experts_per_tok > max(self.num_experts, 1):
            raise ConfigCheckError(
                f"num_experts_per_tok ({self.num_experts_per_tok}) exceeds num_experts ({self.num_experts})",
                ("num_experts_per_tok", "num_experts"),
            )
        return self

    def context_length(self) -> tuple[int, str]:
        """(tokens the model can attend over, where that number comes from). With `hf_path` the checkpoint's
        config.json wins (as when the model is built); a path that is not there yet falls back to the YAML."""
        hf_config = Path(self.hf_path) / "config.json" if self.hf_path else None
        if hf_config is not None and hf_config.is_file():
            try:
                value = json.loads(hf_config.read_text()).get("max_position_embeddings")
            except (OSError, ValueError):
                value = None
            if isinstance(value, int) and value > 0:
                return value, f"max_position_embeddings of {hf_config}"
        return self.max_position_embeddings, "model.max_position_embeddings"


class TokenizerConfig(Section):
    path: str = "embedded"  # "embedded": train the byte-level BPE on the task text; else an HF tokenizer dir
    vocab_size: int = Field(512, ge=260, le=1_000_000)  # the task text saturates near 467 tokens
    n_training_texts: int = Field(4000, ge=100)


class SyntheticDataConfig(Section):
    train_levels: list[SyntheticLevel] = Field(default_factory=lambda: ["L2"], min_length=1)
    eval_levels: list[SyntheticLevel] = Field(default_factory=lambda: ["L2"], min_length=1)
    n_train: int = Field(20000, ge=1)
    n_eval: int = Field(512, ge=1)
    seed: int = Field(0, ge=0)
    # Between solution steps. Tandem's step-level handoff schedules split at "\n\n", so its configs
    # use paragraphs; the default keeps one step per line.
    step_separator: Literal["\n", "\n\n"] = "\n"
    # Reference solutions that call this tool of the `tools` environment (slime_ext.tasks.tool_solutions: one
    # call computing the whole answer, the environment's observation, \boxed{N}); the warm start then shows the
    # tool-call format and its SFT does not train on the observation tokens. null: the step solutions. The
    # prompts and labels are the same either way (configs/grpo_tools.yaml vs grpo_tools_notools.yaml).
    solution_tool: Optional[Literal["calculator", "python"]] = None
    # Task family v2 (levels V2-V10, docs/tasks.md): the share of reference solutions that end with a re-check
    # tail ("Check: ... \boxed{N}" after the answer). null: 0.25. Only v2 rows have tails, so a value without
    # a v2 level in train_levels or eval_levels is rejected.
    recheck_share: Optional[float] = Field(None, ge=0, le=1)
    # Rows of the train pool per level in these proportions, one positive weight per entry of train_levels
    # (e.g. more of the easy levels, so a warm start learns the format and RL sees mixed groups on the hard
    # ones); interleaved through the pool. null: equal shares. The eval pool keeps equal shares per level.
    train_level_weights: Optional[list[float]] = None

    @model_validator(mode="after")
    def _check_solution_tool(self) -> "SyntheticDataConfig":
        if self.solution_tool is not None and self.step_separator != "\n":
            raise ConfigCheckError(
                f"data.synthetic.step_separator = {self.step_separator!r} separates solution steps, but "
                f"data.synthetic.solution_tool = {self.solution_tool!r} replaces the steps by one tool call: it would "
                "change nothing; remove one of them", ("step_separator", "solution_tool"))
        return self

    @model_validator(mode="after")
    def _check_v2_keys(self) -> "SyntheticDataConfig":
        v2 = self.v2_levels()
        if self.recheck_share is not None and not v2:
            raise ConfigCheckError(
                f"data.synthetic.recheck_share = {self.recheck_share} sets the share of re-check tails of task "
                "family v2, but no level in data.synthetic.train_levels or eval_levels is a v2 level (V2-V10): it "
                "would change nothing; remove it or use v2 levels", ("recheck_share", "train_levels", "eval_levels"))
        if self.solution_tool is not None and v2:
            raise ConfigCheckError(
                f"data.synthetic.solution_tool = {self.solution_tool!r} rewrites v1 step solutions into a tool call; "
                f"the v2 levels {v2} have no tool-call form: use levels T1/T2 or L0-L5 with it, or remove it",
                ("solution_tool", "train_levels", "eval_levels"))
        return self

    @model_validator(mode="after")
    def _check_level_weights(self) -> "SyntheticDataConfig":
        w = self.train_level_weights
        if w is None:
            return self
        if len(w) != len(self.train_levels):
            raise ConfigCheckError(
                f"data.synthetic.train_level_weights has {len(w)} values but data.synthetic.train_levels has "
                f"{len(self.train_levels)} levels {self.train_levels}: give one weight per level",
                ("train_level_weights", "train_levels"))
        bad = [x for x in w if not (0 < x < float("inf"))]
        if bad:
            raise ConfigCheckError(
                f"data.synthetic.train_level_weights = {w}: every weight must be positive and finite (got {bad})",
                ("train_level_weights",))
        return self

    def v2_levels(self) -> list[str]:
        """The task family v2 levels among train_levels and eval_levels, in order, each once."""
        return list(dict.fromkeys(x for x in [*self.train_levels, *self.eval_levels] if x in V2_LEVEL_NAMES))

    def recheck_share_value(self) -> float:
        """The share of v2 references with a re-check tail (`recheck_share`, or its default when null)."""
        return DEFAULT_RECHECK_SHARE if self.recheck_share is None else self.recheck_share

    def cache_fields(self) -> dict[str, Any]:
        """The fields that key cached data and warm starts: all of them, except `solution_tool` and
        `train_level_weights` while they are null, and `recheck_share` without v2 levels, so every cache written before those keys existed stays
        valid (its rows are the same). With v2 levels the share is keyed by its value (null = its default)."""
        fields = self.model_dump()
        for key in ("solution_tool", "train_level_weights"):
            if fields[key] is None:
                del fields[key]
        if self.v2_levels():
            fields["recheck_share"] = self.recheck_share_value()
        else:
            del fields["recheck_share"]
        return fields


class DataConfig(Section):
    source: Literal["synthetic_math", "jsonl"] = "synthetic_math"
    train_path: Optional[str] = None  # required when source == "jsonl"
    eval_path: Optional[str] = None
    prompt_key: str = "prompt"
    label_key: str = "label"
    max_bad_fraction: Optional[float] = Field(None, ge=0, le=1)
    template: Literal["plain", "qwen_chat"] = "plain"
    synthetic: SyntheticDataConfig = Field(default_factory=SyntheticDataConfig)
    shuffle: bool = True

    @model_validator(mode="after")
    def _check_paths(self) -> "DataConfig":
        if self.source == "jsonl" and not self.train_path:
            raise ConfigCheckError("data.source is 'jsonl' but data.train_path is not set", ("source", "train_path"))
        return self

    def cache_fields(self) -> dict[str, Any]:
        """`model_dump()` with the synthetic section's `cache_fields` (what keys the SFT warm start)."""
        return dict(self.model_dump(), synthetic=self.synthetic.cache_fields())


class RewardConfig(Section):
    type: Literal["math", "multiple_choice", "code"] = "math"
    timeout_s: float = Field(2.0, gt=0, le=60)
    # Score for a response that is correct but violates the format rule (used by DA-GRPO).
    format_penalty_score: float = Field(0.5, ge=0, le=1)


class RolloutConfig(Section):
    engine: Literal["embedded", "sglang"] = "embedded"
    # Where the rollout manager (data source, method hooks, rewards) runs: a Ray actor (default), or the
    # driver process (for debugging, and for tests that patch method code in-process).
    manager: Literal["actor", "driver"] = "actor"
    prompts_per_step: int = Field(16, ge=1)
    n_samples_per_prompt: int = Field(8, ge=1)
    temperature: float = Field(1.0, ge=0)
    top_p: float = Field(1.0, gt=0, le=1)
    top_k: int = Field(-1, ge=-1)  # -1 = off
    max_prompt_len: int = Field(256, ge=1)
    max_response_len: int = Field(160, ge=1)
    stop: list[str] = Field(default_factory=list)
    threads: int = Field(1, ge=1)  # torch threads of the embedded engine (DESIGN: one per process on 2 cores)
    # Precision of the rollout engine's weights and activations. null: fp32 for the embedded engine and the
    # CPU engine server, the checkpoint's dtype (bf16) for SGLang on GPUs. bf16 on CPU reproduces the GPU
    # train-inference mismatch (an fp32 trainer against a bf16 engine: grpo.mismatch corrects it).
    precision: Optional[Literal["fp32", "bf16"]] = None
    # The embedded engine's forward (the embedded actor and the CPU engine servers; SGLang runs its own).
    # auto: the static-KV forward (slime_ext/engine/static_kv.py: preallocated KV, packed tokens, grouped
    # expert matmuls) for Qwen3 / Qwen3-MoE, transformers' forward for anything else; static: that forward or
    # an error; hf: transformers' forward with a DynamicCache (the reference the static one is tested against).
    engine_kernel: Literal["auto", "static", "hf"] = "auto"
    # RL draws from the first N training prompts only (null or more than there are: all; SFT always uses
    # all). A small pool makes prompts recur across epochs, which DUET's per-prompt statistics need.
    prompt_pool: Optional[int] = Field(None, ge=1)
    # How many weight versions a trained token may be behind the trainer (docs/on-policy.md). 0: on-policy
    # (rollout t with weights version t, then train t). K >= 1: asynchronous: the engines generate the next
    # rollouts while the trainer trains, and step t trains tokens of versions t - K .. t. Needs engines that
    # keep running while the trainer trains (not colocated GPUs).
    max_staleness: int = Field(0, ge=0)
    # max_staleness >= 1 only. wait: a rollout starts only once the weights it would use are at most K versions
    # behind the step that will train it (the engines wait instead of generating what would be too stale; no
    # rollout is ever dropped). drop: the engines keep generating up to K + 1 rollouts ahead of the trainer
    # whatever the version; a rollout whose oldest trained token is more than K versions behind when its turn
    # comes is dropped (counted in async/dropped_groups) and the next one is taken.
    stale_groups: Literal["wait", "drop"] = "wait"
    # max_staleness >= 1 only. false: a weight sync waits for the rollout in flight, so every response is of one
    # version (with stale_groups wait exactly version max(0, r - K) for rollout r: a rerun or a resume
    # reproduces it). true: the sync aborts the requests in flight, updates the weights and continues them
    # (prompt + partial response) with the new weights; every token records its version (Sample.token_versions).
    partial_rollouts: bool = False
    # partial_rollouts only: how a weight sync pauses the requests in flight. abort: the rollout manager aborts
    # them (`/abort_request`, the embedded engine's abort), the engines answer with what they generated, and the
    # manager continues each after the sync as prompt + partial response (prefix re-prefilled under the new
    # weights; any engine). retract / in_place: SGLang's /pause_generation: the requests stay in the engine;
    # retract recomputes their KV under the new weights at /continue_generation, in_place keeps it and goes on
    # (no re-prefill: cheaper for long prefixes, but the KV of the earlier tokens is of the old weights). Both
    # need engine servers (rollout.engine: sglang) that report each token's version (SGLang's
    # meta_info.weight_versions; the project's server does), and retract is refused with train.routing_replay
    # (its re-prefill recomputes the earlier tokens' routes under the new weights).
    pause_mode: Literal["abort", "retract", "in_place"] = "abort"
    # partial_rollouts only: what the trainer does with a resumed response's tokens from before the sync
    # (older than the newest version in their sample). mask: loss_mask 0 (the response still counts for
    # reward and advantage); correct: trained, with the engine logprobs of the version that generated them
    # as the behaviour logprobs (decoupled PPO, see grpo.mismatch).
    # null: mask with partial rollouts; a value without partial rollouts is an error (it would change nothing).
    stale_tokens: Optional[Literal["mask", "correct"]] = None
    # Multi-turn rollouts (docs/environments.md): the environment that answers each model turn, by its name in
    # slime_ext/envs/registry.py (built in: tools); null: one turn per rollout (the single-turn path). The keys
    # below act only with an environment; set without one they are errors.
    env: Optional[str] = None
    max_turns: Optional[int] = Field(None, ge=1)  # model turns per episode (null: DEFAULT_MAX_TURNS)
    # response tokens of an episode, generated + observation (null: max_response_len; at most that, the length
    # the trainer and the memory plan are sized for)
    max_total_tokens: Optional[int] = Field(None, ge=1)
    max_turn_tokens: Optional[int] = Field(None, ge=1)  # generated tokens per turn (null: the method's budget)
    env_settings: dict[str, Any] = Field(default_factory=dict)  # the environment's own settings (its registry model)

    DEFAULT_MAX_TURNS: ClassVar[int] = 4

    @model_validator(mode="after")
    def _check_env(self) -> "RolloutConfig":
        from slime_ext.envs import registry as envs

        if self.env is None:
            for key in ("max_turns", "max_total_tokens", "max_turn_tokens"):
                if getattr(self, key) is not None:
                    raise ConfigCheckError(f"rollout.{key} = {getattr(self, key)} but rollout.env is null: it limits "
                                           "multi-turn episodes, which only an environment runs; set rollout.env or "
                                           "remove the key", (key, "env"))
            if self.env_settings:
                raise ConfigCheckError("rollout.env_settings is set but rollout.env is null: the settings belong to an "
                                       "environment; set rollout.env or remove them", ("env_settings", "env"))
            return self
        if self.env not in envs.ENVS:
            raise ConfigCheckError(f"rollout.env = {self.env!r} is not a registered environment (registered: "
                                   f"{sorted(envs.ENVS)})", ("env",))
        if self.episode_total_tokens > self.max_response_len:
            raise ConfigCheckError(
                f"rollout.max_total_tokens = {self.max_total_tokens} exceeds rollout.max_response_len = "
                f"{self.max_response_len}: an episode's response (generated + observation tokens) is what the trainer "
                "and the memory plan are sized for; raise max_response_len or lower max_total_tokens",
                ("max_total_tokens", "max_response_len"))
        if self.max_turn_tokens is not None and self.max_turn_tokens > self.episode_total_tokens:
            raise ConfigCheckError(
                f"rollout.max_turn_tokens = {self.max_turn_tokens} exceeds the episode's budget of "
                f"{self.episode_total_tokens} tokens (rollout.max_total_tokens, or max_response_len): it would change "
                "nothing; lower it or remove it", ("max_turn_tokens", "max_total_tokens"))
        model = envs.settings_model(self.env)
        if model is None:
            if self.env_settings:
                raise ConfigCheckError(f"rollout.env_settings: environment {self.env!r} takes no settings",
                                       ("env_settings",))
            return self
        try:
            model.model_validate(self.env_settings)
        except ValidationError as exc:
            err = exc.errors()[0]
            where = ".".join(str(p) for p in err["loc"])
            key = "env_settings" + (f".{where}" if where else "")
            raise ConfigCheckError(f"rollout.{key}: {err['msg']} (environment {self.env!r}; {len(exc.errors())} "
                                   "error(s))", (key,)) from None
        return self

    def offered_tools(self) -> list[str]:
        """The tools the run's `tools` environment offers (`env_settings.tools`, its default when unset); none
        for another environment or none."""
        if self.env != "tools":
            return []
        from slime_ext.envs import registry as envs

        return list(envs.settings_model("tools").model_validate(self.env_settings).tools)

    @property
    def episode_turns(self) -> int:
        return self.max_turns or self.DEFAULT_MAX_TURNS

    @property
    def episode_total_tokens(self) -> int:
        return self.max_total_tokens or self.max_response_len

    @model_validator(mode="before")
    @classmethod
    def _renamed_off_policy_steps(cls, data: Any) -> Any:
        if isinstance(data, dict) and "off_policy_steps" in data:
            raise ConfigCheckError(
                f"rollout.off_policy_steps = {data['off_policy_steps']!r} was replaced by rollout.max_staleness (0: "
                "on-policy, 1: the one-step overlap off_policy_steps 1 gave, K: tokens up to K weight versions "
                "behind); rename the key", ("off_policy_steps",))
        return data

    @property
    def asynchronous(self) -> bool:
        """Rollouts generated while the trainer trains (`max_staleness` >= 1)."""
        return self.max_staleness > 0

    @model_validator(mode="after")
    def _check_off_policy(self) -> "RolloutConfig":
        for key, default in (("partial_rollouts", False), ("stale_groups", "wait")):
            if getattr(self, key) != default and not self.asynchronous:
                raise ConfigCheckError(
                    f"rollout.{key} = {getattr(self, key)!r} but rollout.max_staleness is 0: it shapes asynchronous "
                    "rollouts (generated while the trainer trains), which an on-policy run does not have; set "
                    f"rollout.max_staleness >= 1 (or remove rollout.{key})", (key, "max_staleness"))
        if self.pause_mode != "abort" and not self.partial_rollouts:
            raise ConfigCheckError(
                f"rollout.pause_mode = {self.pause_mode!r} but rollout.partial_rollouts is false: a weight sync then "
                "waits for the rollout in flight and pauses nothing; set rollout.partial_rollouts=true (or remove "
                "rollout.pause_mode)", ("pause_mode", "partial_rollouts"))
        if self.pause_mode != "abort" and self.engine != "sglang":
            raise ConfigCheckError(
                f"rollout.pause_mode = {self.pause_mode!r} pauses requests inside engine servers (SGLang's "
                "/pause_generation), but rollout.engine is 'embedded'; set rollout.engine=sglang or "
                "rollout.pause_mode=abort", ("pause_mode", "engine"))
        if self.stale_tokens is not None and not self.partial_rollouts:
            raise ConfigCheckError(
                f"rollout.stale_tokens = {self.stale_tokens!r} but rollout.partial_rollouts is false: without partial "
                "rollouts every response comes from one weight version, so no token is older than its sample's "
                "newest and the key changes nothing; remove it (or set rollout.partial_rollouts=true)",
                ("stale_tokens", "partial_rollouts"))
        return self

    @property
    def stale_token_policy(self) -> str:
        """What partial rollouts do with tokens older than their sample's newest: `stale_tokens`, mask by default."""
        return self.stale_tokens or "mask"


class SGLangConfig(Section):
    """How SGLang servers are launched on a cluster (ignored by the embedded engine)."""

    model_path: Optional[str] = None
    tp_size: int = Field(1, ge=1)
    num_engines: int = Field(1, ge=1)
    mem_fraction_static: float = Field(0.8, gt=0, lt=1)
    enable_custom_logit_processor: bool = True
    router: bool = False
    extra_server_args: list[str] = Field(default_factory=list)
    # How the trainer's weights reach the engines after every step (slime_ext.engine.weight_sync):
    # disk = HF safetensors + /update_weights_from_disk; tensor = /update_weights_from_tensor (colocated);
    # distributed = /init_weights_update_group + broadcast (NCCL on GPUs, gloo on CPU).
    # auto (the default) resolves at validation: tensor when cluster.colocate (the engines share the trainer's
    # devices), distributed otherwise; disk only when asked (a full copy of the model through a filesystem per
    # step). `weight_sync_reason` says which rule chose it (`--check` and the plan print it).
    weight_sync: Literal["auto", "disk", "tensor", "distributed"] = "auto"
    # Every process holds at most its shard plus about two buckets of this size beyond it during a sync.
    weight_bucket_mb: float = Field(512.0, gt=0)
    # Senders per expert-parallel rank on the disk and distributed paths: each EP rank sends its own experts and
    # the stage's first rank the dense part, so a stage's bytes leave over its EP ranks' links instead of one
    # rank gathering every expert (the tensor path keeps one sender per stage).
    expert_senders: bool = True
    # Deadline of one weight sync (the ranks' pushes) and of each control call in it: a hung engine or a rank
    # that never sends stops the run within it, naming the engine or rank and the resume command. null: derived
    # from the model's size (slime_ext.engine.sync_deadline: 120 s + 10x the bytes over 1 GB/s).
    weight_sync_timeout_s: Optional[float] = Field(None, gt=0)
    # Send only the elements whose engine-dtype value changed (indices + values), checksummed per tensor.
    # Carried by payloads: the embedded engine and weight_sync=tensor (SGLang's custom weight loader).
    weight_sync_delta: bool = False
    # A restarted engine loads the base checkpoint, or the newest sharded snapshot written every this many
    # syncs by the ranks (0 = never), and is then brought to the current version by a sync from the ranks.
    snapshot_every: int = Field(0, ge=0)
    max_restarts: int = Field(2, ge=0)  # per engine and run: a dead server is restarted this often, then the run stops
    startup_timeout_s: float = Field(600.0, gt=0)  # to health after a (re)start
    request_timeout_s: float = Field(600.0, gt=0)  # one /generate; past it the request is aborted and retried
    # How a step's requests share /generate calls (SGLang's batch form): "request" one per call, "group" one
    # call per prompt group (its samples share the prompt, the engine and the prefix cache), "call" all of a
    # step's requests for one engine in calls of at most 64 (per prompt group behind a router)
    generate_batching: Literal["request", "group", "call"] = "group"
    host: str = "127.0.0.1"  # where engine servers listen; "node": the address Ray gives the engine's node
    base_port: int = Field(0, ge=0, le=65535)  # engine i listens on base_port + i; 0 = free ports

    @staticmethod
    def auto_weight_sync(colocate: bool) -> str:
        """What `weight_sync: auto` resolves to: tensor for colocated engines, distributed for engines on their
        own devices."""
        return "tensor" if colocate else "distributed"

    def weight_sync_reason(self, colocate: bool) -> str:
        """Why this path (for `--check` and the plan); stateless, so a resolved config reloads equal."""
        auto = self.auto_weight_sync(colocate)
        if self.weight_sync == auto == "tensor":
            return ("the default for colocated engines: each engine rank reads the buckets from the trainer on its "
                    "own device (CUDA IPC handles; shared memory on CPU) through SGLang's own loader")
        if self.weight_sync == auto == "distributed":
            return ("the default for engines on their own devices: each sender broadcasts its buckets to the "
                    "engines over a weight-update group (NCCL; gloo on CPU)")
        return f"set in the config; the default for this layout is {auto}"

    def resolve_weight_sync(self, colocate: bool) -> None:
        """`auto` -> the path that fits the layout (idempotent; an explicit choice is kept)."""
        if self.weight_sync == "auto":
            self.weight_sync = self.auto_weight_sync(colocate)


class ParallelConfig(Section):
    tensor_model_parallel_size: int = Field(1, ge=1)
    pipeline_model_parallel_size: int = Field(1, ge=1)
    expert_model_parallel_size: int = Field(1, ge=1)
    # Expert tensor parallel: None = the TP size (megatron-core's default: experts split like dense MLPs);
    # 1 = experts whole on every TP rank (slime's Qwen3-30B-A3B layout, TP 4 x EP 8 on 8 GPUs).
    expert_tensor_parallel_size: Optional[int] = Field(None, ge=1)
    data_parallel_size: int = Field(1, ge=1)
    sequence_parallel: bool = False
    recompute: Literal["none", "selective", "full"] = "none"
    use_distributed_optimizer: bool = True
    optimizer_cpu_offload: bool = False
    # Padded tokens (rows x longest row) per micro-batch, besides train.micro_batch_size rows (slime's
    # --max-tokens-per-gpu): the bound the memory plan sizes activations by; a longer sample trains alone.
    max_tokens_per_gpu: int = Field(8192, ge=1)


class LoRAConfig(Section):
    """LoRA RL (megatron_glue/lora.py): the RL stage trains rank-`rank` adapters on the named linear layers and
    nothing else (the SFT warm start trains every weight). 0: off."""

    rank: int = Field(0, ge=0)
    alpha: float = Field(16.0, gt=0)  # the update is scaled by alpha / rank
    dropout: float = Field(0.0, ge=0, lt=1)  # on the adapter's input
    # attention input (q/k/v) and output, dense MLP input and output; "experts": every routed expert's fc1 and fc2
    # (needs train.parallel.expert_tensor_parallel_size 1, or TP 1)
    target_modules: list[Literal["linear_qkv", "linear_proj", "linear_fc1", "linear_fc2", "experts"]] = Field(
        default_factory=lambda: ["linear_qkv", "linear_proj", "linear_fc1", "linear_fc2"], min_length=1)
    # How the engines get the policy after each step: "merged" sends the merged weights (the whole model, any
    # engine or transport); "adapter" sends the adapters alone (SGLang's /load_lora_adapter_from_tensors, megabytes)
    # and every request names them (lora_path); the engines keep the base from their start.
    sync: Literal["merged", "adapter"] = "merged"

    def check_run(self, config: Any) -> None:
        """Expert adapters: experts whole on their ranks. Adapter sync: an adapter to send, one tensor transport,
        and no engine feature it cannot serve."""
        parallel = config.train.parallel
        expert_tp = parallel.expert_tensor_parallel_size or parallel.tensor_model_parallel_size
        if self.rank and "experts" in self.target_modules and expert_tp > 1:
            raise ConfigCheckError(f"train.lora.target_modules names 'experts' but the experts are split {expert_tp} "
                                   "ways over tensor parallelism: LoRA on the experts needs them whole on every rank "
                                   "(set train.parallel.expert_tensor_parallel_size=1)",
                                   ("train.lora.target_modules", "train.parallel.expert_tensor_parallel_size"))
        if self.sync != "adapter":
            return
        if self.rank < 1:
            raise ConfigCheckError("train.lora.sync = adapter needs train.lora.rank >= 1", ("train.lora.sync",))
        if config.rollout.partial_rollouts:
            raise ConfigCheckError("train.lora.sync = adapter with rollout.partial_rollouts: a request continued after "
                                   "a sync would switch adapters mid-response; set train.lora.sync=merged",
                                   ("train.lora.sync", "rollout.partial_rollouts"))
        if config.rollout.engine == "sglang" and config.cluster.colocate and config.cluster.colocate_sleep \
                and not config.rollout.asynchronous:
            raise ConfigCheckError("train.lora.sync = adapter with colocated engines that sleep: a sleeping engine "
                                   "gives its weights back and wakes with zeros, and the adapter alone cannot refill "
                                   "the base; set cluster.colocate_sleep=false (or train.lora.sync=merged)",
                                   ("train.lora.sync", "cluster.colocate_sleep"))
        if config.rollout.engine == "sglang" and config.sglang.snapshot_every:
            raise ConfigCheckError("train.lora.sync = adapter writes no weight snapshots: set sglang.snapshot_every=0",
                                   ("train.lora.sync", "sglang.snapshot_every"))
        if config.rollout.engine == "sglang" and (config.sglang.weight_sync != "tensor" or config.sglang.weight_sync_delta):
            raise ConfigCheckError(
                f"train.lora.sync = adapter sends the adapters by /load_lora_adapter_from_tensors; sglang.weight_sync = "
                f"{config.sglang.weight_sync!r} (delta {config.sglang.weight_sync_delta}) would go unused: set "
                "sglang.weight_sync=tensor and sglang.weight_sync_delta=false", ("train.lora.sync", "sglang.weight_sync"))


class TrainConfig(Section):
    lr: float = Field(3e-5, gt=0)
    min_lr: float = Field(0.0, ge=0)
    lr_warmup_steps: int = Field(0, ge=0)
    lr_decay_style: Literal["constant", "linear", "cosine"] = "constant"
    weight_decay: float = Field(0.0, ge=0)
    adam_beta1: float = Field(0.9, ge=0, lt=1)
    adam_beta2: float = Field(0.98, ge=0, lt=1)
    adam_eps: float = Field(1e-8, gt=0)
    clip_grad: float = Field(1.0, ge=0)
    steps: int = Field(150, ge=0)
    micro_batch_size: int = Field(16, ge=1)
    threads: int = Field(1, ge=1)  # torch threads per trainer rank (SFT: train + rollout threads over the ranks)
    precision: Literal["fp32", "bf16"] = "fp32"
    parallel: ParallelConfig = Field(default_factory=ParallelConfig)
    # Mini-batch PPO: samples per optimizer step; the rollout batch (prompts_per_step x n_samples_per_prompt)
    # is cut into rollout batch / global_batch_size optimizer steps (slime's --global-batch-size). null: one.
    global_batch_size: Optional[int] = Field(None, ge=1)
    # Before the first update, compare the trainer's logprobs on the first rollout batch with the engine's
    # and stop the run if their mean |difference| exceeds consistency_tolerance (slime's step-0 CI check).
    check_consistency_at_start: bool = False
    # null: 1e-3 when engine and trainer run in one precision (only kernel noise is expected), 0.1 when not
    consistency_tolerance: Optional[float] = Field(None, gt=0)
    # Rollout routing replay (R3, MoE only): the engine records each token's top-k experts and the trainer's
    # MoE layers replay them in logprob recompute and training (docs/routing-replay.md).
    routing_replay: bool = False
    # Log-probs and entropy are taken from the LM head a chunk of tokens at a time, never as [tokens, vocab]
    # logits (megatron_glue/logprobs.py): MiB of fp32 logits per chunk; tokens per chunk = this / (4 x vocab / TP).
    # Peak memory beyond activations is ~4 chunks; the default suits any vocabulary.
    logprob_chunk_mb: float = Field(512.0, gt=0)
    lora: LoRAConfig = Field(default_factory=LoRAConfig)


class SFTConfig(Section):
    steps: int = Field(700, ge=0)
    lr: float = Field(1e-3, gt=0)
    batch_size: int = Field(64, ge=1)
    warmup_steps: int = Field(20, ge=0)
    lr_decay_style: Literal["constant", "linear", "cosine"] = "cosine"  # after the warm-up, down to min_lr
    min_lr_ratio: float = Field(0.1, ge=0, le=1)  # min_lr = lr x this
    # Seed of the warm start (init and data order); None = run.seed. Studies vary run.seed (RL sampling)
    # over one shared warm start by fixing this.
    seed: Optional[int] = Field(None, ge=0)


class MismatchConfig(Section):
    """Train-inference mismatch correction (slime_ext.algo.mismatch): weight each token's policy-gradient term
    by r = pi_old / pi_engine, bounded. TIS = truncate/token; IcePop = mask/token; MIS = mask/sequence."""

    mode: Literal["none", "truncate", "mask"] = "none"  # truncate: w = min(r, cap); mask: w = r in [low, high] else 0
    level: Literal["token", "sequence", "geometric"] = "token"  # r per token, per sequence, or its geometric mean
    cap: float = Field(2.0, ge=1)
    low: float = Field(0.5, gt=0, le=1)
    high: float = Field(2.0, ge=1)


class GRPOConfig(Section):
    """The shared GRPO core (clip, KL, entropy, aggregation) every method's loss starts from."""

    normalize_std: bool = True
    adv_eps: float = Field(1e-6, gt=0)
    eps_clip_low: float = Field(0.2, ge=0, le=1)
    eps_clip_high: float = Field(0.2, ge=0, le=10)
    kl_coef: float = Field(0.0, ge=0)
    kl_estimator: Literal["k1", "k2", "k3", "low_var_kl"] = "low_var_kl"
    entropy_coef: float = Field(0.0, ge=0)
    loss_agg: Literal["token_mean", "sample_mean"] = "token_mean"
    # The PPO ratio's old policy: the engine's logprobs, or the trainer's recomputed before the first update
    # of a step. null: trainer when a step takes several optimizer steps (train.global_batch_size), a
    # mismatch correction is on or rollouts are asynchronous (rollout.max_staleness >= 1), else engine. The
    # trainer's recomputed logprobs are then the proximal policy of decoupled PPO: the clip is taken against
    # them, and the engine's (behaviour) logprobs enter through grpo.mismatch's importance weight.
    old_logprobs: Optional[Literal["engine", "trainer"]] = None
    mismatch: MismatchConfig = Field(default_factory=MismatchConfig)

    def resolved_old_logprobs(self, minibatches: int, off_policy: bool = False) -> str:
        if self.old_logprobs is not None:
            return self.old_logprobs
        return "trainer" if minibatches > 1 or off_policy or self.mismatch.mode != "none" else "engine"


class EvalConfig(Section):
    # null: the warm start and the final weights only; N: also after every N RL steps (eval_step<N>.json)
    every: Optional[int] = Field(None, ge=1)
    n_prompts: int = Field(512, ge=1)
    n_samples: int = Field(4, ge=1)
    k: list[int] = Field(default_factory=lambda: [1, 4])
    temperature: float = Field(1.0, ge=0)
    greedy: bool = True
    # false: no evaluation of the SFT warm start (eval_warm_start.json); a study whose arms share one warm start
    # evaluates it in one arm and spares the others the same minutes
    warm_start: bool = True

    @model_validator(mode="after")
    def _check_k(self) -> "EvalConfig":
        bad = [k for k in self.k if k < 1 or k > self.n_samples]
        if bad:
            raise ConfigCheckError(f"eval.k values {bad} must lie in [1, eval.n_samples={self.n_samples}]",
                                   ("k", "n_samples"))
        return self








class ClusterConfig(Section):
    num_nodes: int = Field(1, ge=1)
    gpus_per_node: int = Field(0, ge=0)  # 0: CPU-only (embedded engine, gloo)
    # Memory the plan holds layouts against (slime_ext.orchestration.memory_model): a trainer or engine estimate
    # above gpu_memory_gib, or an offloaded optimizer above host_memory_gib per node (null: not checked), is
    # refused by the plan, the launcher's --dry-run and `python -m slime_ext.config --check`.
    gpu_memory_gib: float = Field(80.0, gt=0)
    host_memory_gib: Optional[float] = Field(None, gt=0)
    colocate: bool = True
    # With colocate: the engines release their weights and KV cache while the trainer trains (SGLang's
    # /release_memory_occupation; they resume weights, take the sync, then resume the KV cache), and the trainer
    # moves its weights, gradients and device optimizer state off the GPU during rollouts
    # (megatron_glue.trainer_sleep). Off: both stay resident, which the memory plan refuses on GPUs.
    colocate_sleep: bool = True
    ray_address: Optional[str] = None
    # Custom Ray resources every trainer rank / engine actor asks for: the nodes that advertise them
    # (`ray start --resources='{"trainer_node": 8}'`) are where that group runs. Empty: anywhere.
    trainer_resources: dict[str, float] = Field(default_factory=dict)
    engine_resources: dict[str, float] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _custom_resources_only(self) -> "ClusterConfig":
        for key in ("trainer_resources", "engine_resources"):
            for name, amount in getattr(self, key).items():
                if name in ("CPU", "GPU", "memory") or amount <= 0:
                    raise ValueError(f"cluster.{key}: {name!r}: {amount} must be a custom resource name with a "
                                     f"positive amount (CPU and GPU come from the layout)")
            if getattr(self, key) and self.gpus_per_node > 0:
                raise ValueError(f"cluster.{key} places CPU runs (cluster.gpus_per_node 0); a GPU run's trainer and "
                                 f"engines share one placement group packed node by node: leave it empty")
        return self


class LoggingConfig(Section):
    """Experiment logging besides metrics.jsonl (slime_ext.orchestration.run_logger)."""

    tensorboard: bool = True  # event files in <run dir>/tensorboard
    wandb: bool = False  # Weights & Biases (needs `pip install wandb`)
    wandb_project: str = "slime-ext"
    wandb_entity: Optional[str] = None
    wandb_mode: Literal["online", "offline"] = "online"  # offline: files under <run dir>/wandb, `wandb sync` later

    @model_validator(mode="after")
    def _wandb_installed(self) -> "LoggingConfig":
        if self.wandb:
            import importlib.util

            if importlib.util.find_spec("wandb") is None:
                raise ValueError("wandb is true but the wandb package is not installed "
                                 "(pip install wandb, or set logging.wandb=false)")
        return self


class CoreConfig(Section):
    """The run-wide sections. A run's config model (slime_ext.config.schema.config_model) adds its method's own
    sections, and no other method's, and checks `method` against the registry."""

    method: str = "grpo"
    run: RunConfig = Field(default_factory=RunConfig)
    model: ModelConfig = Field(default_factory=ModelConfig)
    tokenizer: TokenizerConfig = Field(default_factory=TokenizerConfig)
    data: DataConfig = Field(default_factory=DataConfig)
    reward: RewardConfig = Field(default_factory=RewardConfig)
    rollout: RolloutConfig = Field(default_factory=RolloutConfig)
    sglang: SGLangConfig = Field(default_factory=SGLangConfig)
    train: TrainConfig = Field(default_factory=TrainConfig)
    sft: SFTConfig = Field(default_factory=SFTConfig)
    grpo: GRPOConfig = Field(default_factory=GRPOConfig)
    eval: EvalConfig = Field(default_factory=EvalConfig)
    cluster: ClusterConfig = Field(default_factory=ClusterConfig)
    logging: LoggingConfig = Field(default_factory=LoggingConfig)

    @model_validator(mode="after")
    def _check_context(self) -> "CoreConfig":
        """A prompt and its response must fit the model's context together: the engine and the trainer
        see `max_prompt_len + max_response_len` tokens (rollouts, SFT rows), and past the context the
        positions are ones the model never learned (or the engine refuses the request)."""
        r = self.rollout
        context, source = self.model.context_length()
        if r.max_prompt_len + r.max_response_len > context:
            raise ConfigCheckError(
                f"rollout.max_prompt_len + rollout.max_response_len = {r.max_prompt_len} + {r.max_response_len} = "
                f"{r.max_prompt_len + r.max_response_len} exceeds the model's context ({source} = {context})",
                ("rollout.max_prompt_len", "rollout.max_response_len", "model.max_position_embeddings"),
            )
        s = self.sglang
        s.resolve_weight_sync(self.cluster.colocate)
        if s.weight_sync_delta and self.rollout.engine == "sglang" and self.cluster.gpus_per_node > 0:
            raise ConfigCheckError(
                "sglang.weight_sync_delta=true cannot run on SGLang's own engines (cluster.gpus_per_node > 0): a "
                "delta patches elements of HF-named tensors, and SGLang's Qwen3-MoE holds fused parameters instead "
                "(qkv_proj = [q; k; v], gate_up_proj, FusedMoE w13 / w2, each cut by the engine's TP rank), which "
                "its loader fills only from whole HF tensors; set sglang.weight_sync_delta=false (delta sync runs "
                "with the embedded engine and the project's CPU server)", ("sglang.weight_sync_delta",
                                                                           "cluster.gpus_per_node"))
        if s.weight_sync_delta and self.rollout.engine == "sglang" and s.weight_sync != "tensor":
            raise ConfigCheckError(
                f"sglang.weight_sync_delta=true needs sglang.weight_sync=tensor with engine servers (got "
                f"{s.weight_sync!r}): deltas travel as payloads that SGLang applies with a custom weight loader, "
                f"which only /update_weights_from_tensor runs", ("sglang.weight_sync_delta", "sglang.weight_sync"))
        return self

    def rollout_batch_size(self) -> int:
        return self.rollout.prompts_per_step * self.rollout.n_samples_per_prompt

    def minibatches_per_step(self) -> int:
        """Optimizer steps per rollout batch (mini-batch PPO)."""
        gbs = self.train.global_batch_size
        return 1 if gbs is None else max(1, self.rollout_batch_size() // gbs)

    @model_validator(mode="after")
    def _check_minibatches(self) -> "CoreConfig":
        """Mini-batches must cut the rollout batch evenly and hold a sample per data-parallel rank; a mismatch
        correction needs the trainer's old logprobs (the engine's against themselves give a ratio of 1)."""
        gbs, batch = self.train.global_batch_size, self.rollout_batch_size()
        if gbs is not None and (gbs > batch or batch % gbs):
            raise ConfigCheckError(
                f"train.global_batch_size = {gbs} does not divide the rollout batch rollout.prompts_per_step x "
                f"rollout.n_samples_per_prompt = {batch}; use a divisor of {batch} (e.g. {batch // 2 or 1} for two "
                "optimizer steps per rollout) or null for one step",
                ("train.global_batch_size", "rollout.prompts_per_step", "rollout.n_samples_per_prompt"))
        dp = self.train.parallel.data_parallel_size
        if gbs is not None and gbs < dp:
            raise ConfigCheckError(
                f"train.global_batch_size = {gbs} is smaller than train.parallel.data_parallel_size = {dp}: every "
                "data-parallel rank needs a sample of each mini-batch", ("train.global_batch_size",
                                                                         "train.parallel.data_parallel_size"))
        if self.grpo.mismatch.mode != "none" and self.grpo.old_logprobs == "engine":
            raise ConfigCheckError(
                f"grpo.mismatch.mode = {self.grpo.mismatch.mode} needs the trainer's old logprobs, but "
                "grpo.old_logprobs = engine (the engine's logprobs against themselves give a ratio of 1); set "
                "grpo.old_logprobs=trainer (or null)", ("grpo.mismatch.mode", "grpo.old_logprobs"))
        return self

    @model_validator(mode="after")
    def _check_solution_tool(self) -> "CoreConfig":
        """Tool-call reference solutions teach calls that only the `tools` environment offering that tool answers."""
        tool = self.data.synthetic.solution_tool
        if tool is None or self.data.source != "synthetic_math":
            return self
        keys = ("data.synthetic.solution_tool", "rollout.env")
        if self.rollout.env != "tools":
            raise ConfigCheckError(
                f"data.synthetic.solution_tool = {tool!r} teaches the model to call a tool, but rollout.env = "
                f"{self.rollout.env!r}: no environment would answer the calls; set rollout.env=tools (or "
                "data.synthetic.solution_tool=null for the same problems without tools)", keys)
        offered = self.rollout.offered_tools()
        if tool not in offered:
            raise ConfigCheckError(
                f"data.synthetic.solution_tool = {tool!r} but rollout.env_settings.tools = {offered} does not offer "
                "it", ("data.synthetic.solution_tool", "rollout.env_settings.tools"))
        return self

    @model_validator(mode="after")
    def _check_retract_with_replay(self) -> "CoreConfig":
        """A retracted request is re-prefilled under the new weights: the engine's routes for its earlier tokens
        are then the new version's, which would pair old-version logprobs with new-version routes."""
        if self.rollout.pause_mode == "retract" and self.train.routing_replay:
            raise ConfigCheckError(
                "rollout.pause_mode = 'retract' with train.routing_replay = true: a retracted request is re-prefilled "
                "under the new weights, so the routes the engine returns for its earlier tokens are the new "
                "version's while their logprobs are the old one's; use rollout.pause_mode=in_place (keeps the "
                "routes of the KV it keeps) or abort (the manager keeps each call's routes)",
                ("rollout.pause_mode", "train.routing_replay"))
        return self

    @model_validator(mode="after")
    def _check_routing_replay(self) -> "CoreConfig":
        """Routing replay replays MoE routers: a dense model has none."""
        m = self.model
        if self.train.routing_replay and (m.arch == "qwen3" or m.num_experts == 0):
            raise ConfigCheckError(
                f"train.routing_replay = true needs a MoE model, but model.arch = {m.arch!r} and model.num_experts = "
                f"{m.num_experts} (a dense model has no router to replay); set train.routing_replay=false",
                ("train.routing_replay", "model.arch", "model.num_experts"),
            )
        return self

    @model_validator(mode="after")
    def _check_off_policy_placement(self) -> "CoreConfig":
        """Asynchronous rollouts are generated while the trainer trains; colocated GPU engines sleep (release their
        memory) during training, so nothing could overlap and the engines would be asked to generate asleep."""
        if self.rollout.asynchronous and self.cluster.colocate and self.cluster.gpus_per_node > 0:
            raise ConfigCheckError(
                f"rollout.max_staleness = {self.rollout.max_staleness} with cluster.colocate = true on a GPU "
                f"cluster (cluster.gpus_per_node = {self.cluster.gpus_per_node}): colocated engines sleep while the "
                "trainer trains, so the next rollout cannot run beside it; set cluster.colocate=false (engines on "
                "their own GPUs) or rollout.max_staleness=0",
                ("rollout.max_staleness", "cluster.colocate", "cluster.gpus_per_node"),
            )
        return self

    @model_validator(mode="after")
    def _check_periodic_eval(self) -> "CoreConfig":
        """An evaluation between steps needs the engine to itself: off-policy, the next rollout is already
        generating on it when a step ends, so the evaluation would share it and wait for it."""
        if self.eval.every is not None and self.rollout.asynchronous:
            raise ConfigCheckError(
                f"eval.every = {self.eval.every} with rollout.max_staleness = {self.rollout.max_staleness}: "
                "an evaluation between steps would share the engines with the next rollout already in flight; set "
                "eval.every=null (evaluate the checkpoints instead) or rollout.max_staleness=0",
                ("eval.every", "rollout.max_staleness"),
            )
        return self

    @model_validator(mode="after")
    def _check_cpu_engine_servers(self) -> "CoreConfig":
        """On a CPU run the engine servers are the project's one-process servers: no tensor parallelism."""
        if self.rollout.engine == "sglang" and self.cluster.gpus_per_node == 0 and self.sglang.tp_size > 1:
            raise ConfigCheckError(
                f"sglang.tp_size = {self.sglang.tp_size} on a CPU run (cluster.gpus_per_node = 0): the CPU engine "
                "server is one process per engine; set sglang.tp_size=1 (or run on GPUs)",
                ("sglang.tp_size", "cluster.gpus_per_node"),
            )
        return self
