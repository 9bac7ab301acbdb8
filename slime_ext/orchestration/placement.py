"""Where a run's processes go: the trainer world, the one placement group, and every Ray actor's request.

One model for both readers: the dry-run plan (`slime_ext.orchestration.plan`) prints it and the training
job builds exactly it (`TrainingJob` creates the rollout manager, the engine and the train actors from
`actor_groups(config)`), so a plan that fits is the layout that runs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

# slime's fractional GPU requests: two actors (trainer rank, engine) share one bundle when colocated
COLOCATED_TRAIN_GPU, COLOCATED_ENGINE_GPU = 0.4, 0.2
CPU_SHARE = 0.01  # CPU runs: every actor asks for a token share so many processes fit 2 cores


@dataclass(frozen=True)
class ActorGroup:
    name: str
    count: int
    resources: dict[str, float]  # what one actor asks Ray for
    bundles: list[list[int]]  # placement-group bundle indices of each actor ([] = no placement group)
    node: str  # where it runs


@dataclass(frozen=True)
class Placement:
    bundle: dict[str, float]
    num_bundles: int
    bundles_per_node: int
    strategy: str


def engine_gpus(config: Any) -> int:
    """GPUs the SGLang engines occupy (0 for the embedded engine or a CPU run)."""
    if config.rollout.engine != "sglang" or config.cluster.gpus_per_node == 0:
        return 0
    return config.sglang.num_engines * config.sglang.tp_size


def scoring_servers(config: Any) -> Optional[Any]:
    """The method's scoring engine servers (`Method.scoring_servers`: on-policy distillation's teacher), or None."""
    from slime_ext.methods.registry import method_class

    return method_class(config).scoring_servers(config)


def scoring_own_gpus(config: Any) -> int:
    """GPUs the scoring servers take for themselves (placement `own` on a GPU run), beside trainer and engines."""
    servers = scoring_servers(config)
    if servers is None or servers.placement != "own" or config.cluster.gpus_per_node == 0:
        return 0
    return servers.num_engines * servers.tp_size


def trainer_world(config: Any, problems: Optional[list[str]] = None) -> int:
    """GPU runs: all GPUs when colocated, else what the engines leave; CPU runs: TP * PP * DP processes.
    Problems (engines that do not fit) are appended to `problems` when given, else raised."""
    own = problems is None
    problems = [] if own else problems
    c, par = config.cluster, config.train.parallel
    if c.gpus_per_node == 0:
        return par.tensor_model_parallel_size * par.pipeline_model_parallel_size * par.data_parallel_size
    scoring = scoring_own_gpus(config)
    total = c.num_nodes * c.gpus_per_node - scoring  # a scorer's own GPUs are nobody else's
    engines = engine_gpus(config)
    world = max(total, 1)
    if scoring and total < 1:
        problems.append(f"the scoring servers take {scoring} GPUs of their own ({scoring_servers(config).size_keys}), "
                        f"all {total + scoring} of cluster.num_nodes x cluster.gpus_per_node: none is left")
    elif c.colocate:
        if engines > total:
            problems.append(f"sglang.num_engines x sglang.tp_size = {engines} GPUs exceed the {total} GPUs of "
                            "cluster.num_nodes x cluster.gpus_per_node" + (f" left by the scoring servers' own {scoring}"
                                                                           if scoring else ""))
    else:
        world = max(total - engines, 1)
        if total - engines < 1:
            problems.append(f"cluster.colocate is false and the engines (sglang.num_engines x sglang.tp_size = "
                            f"{engines}) take all {total} GPUs" + (f" the scoring servers' own {scoring} leave"
                                                                  if scoring else "") + ": nothing is left for the trainer")
    if own and problems:
        raise ValueError("; ".join(problems))
    return world


def engine_count(config: Any) -> tuple[int, int]:
    """(number of engines, tensor-parallel size of each): one single-device engine unless SGLang."""
    sglang = config.rollout.engine == "sglang"
    return (config.sglang.num_engines, config.sglang.tp_size) if sglang else (1, 1)


def build_placement(config: Any) -> Placement:
    """One placement group for everything (slime): a GPU + CPU bundle per GPU; on CPU a token CPU share per
    trainer rank, so gloo ranks on 2 cores still schedule."""
    world, gpus_per_node = trainer_world(config), config.cluster.gpus_per_node
    custom = dict(config.cluster.trainer_resources)
    if gpus_per_node == 0:
        return Placement({"CPU": CPU_SHARE, **custom}, world, world, "PACK")
    n = (world if config.cluster.colocate else world + engine_gpus(config)) + scoring_own_gpus(config)
    return Placement({"GPU": 1, "CPU": 1, **custom}, n, gpus_per_node, "PACK")


def actor_groups(config: Any) -> dict[str, ActorGroup]:
    """The rollout manager, the engine(s) and one train actor per rank, with their Ray requests."""
    world, gpu, colocate = trainer_world(config), config.cluster.gpus_per_node > 0, config.cluster.colocate
    if config.rollout.manager == "driver":
        manager = ActorGroup("rollout_manager", 1, {}, [], "head node, in the driver process")
    else:
        manager = ActorGroup("rollout_manager", 1, {"CPU": CPU_SHARE}, [], "head node, a Ray actor")
    train_res = {"GPU": COLOCATED_TRAIN_GPU if colocate else 1.0, "CPU": 1} if gpu else {"CPU": CPU_SHARE}
    train_res.update(config.cluster.trainer_resources)
    train = ActorGroup("train_actor", world, train_res, [[r] for r in range(world)],
                       "one per trainer rank" + _on_nodes(config.cluster.trainer_resources))
    num_engines, tp = engine_count(config)
    if config.rollout.engine != "sglang" or not gpu:
        engine_res = {"CPU": CPU_SHARE, **config.cluster.engine_resources}
        engine = ActorGroup(f"{config.rollout.engine}_engine", num_engines, engine_res, [],
                            _on_nodes(config.cluster.engine_resources).removeprefix(", ") or "head node")
        groups = {"manager": manager, "engine": engine, "train": train}
        servers = scoring_servers(config)
        if servers is not None:
            groups["scoring"] = ActorGroup("scoring_engine", servers.num_engines, dict(engine_res), [],
                                           f"one server per scoring engine ({servers.key}), beside the engines")
        return groups
    servers = scoring_servers(config)
    shared = colocate or (servers is not None and servers.placement == "colocated")  # engines share their GPUs
    offset = 0 if colocate else world
    engine_bundles = [list(range(offset + i * tp, offset + (i + 1) * tp)) for i in range(num_engines)]
    engine_res = {"GPU": COLOCATED_ENGINE_GPU if shared else 1.0, "CPU": 1}
    engines = ActorGroup("sglang_engine", num_engines, engine_res, engine_bundles,
                         f"one server per engine, tp_size={tp} on its bundles' GPUs")
    groups = {"manager": manager, "engine": engines, "train": train}
    if servers is not None:
        groups["scoring"] = _scoring_group(servers, offset if servers.placement == "colocated"
                                           else world + (0 if colocate else engine_gpus(config)))
    return groups


def _scoring_group(servers: Any, first_bundle: int) -> ActorGroup:
    """The scoring servers on a GPU run: on GPUs of their own after the trainer's and the engines' bundles, or
    on the rollout engines' first GPUs (a fractional request beside the engine's)."""
    tp, own = servers.tp_size, servers.placement == "own"
    bundles = [list(range(first_bundle + i * tp, first_bundle + (i + 1) * tp)) for i in range(servers.num_engines)]
    where = "on GPUs of their own" if own else "on the rollout engines' GPUs"
    return ActorGroup("scoring_engine", servers.num_engines, {"GPU": 1.0 if own else COLOCATED_ENGINE_GPU, "CPU": 1},
                      bundles, f"one server per scoring engine ({servers.key}), tp_size={tp} {where}")


def _on_nodes(resources: dict[str, float]) -> str:
    return f", on nodes with {', '.join(sorted(resources))}" if resources else ""


def ray_options(group: ActorGroup) -> dict[str, Any]:
    """`ray.remote(...).options(...)` resource arguments of one actor of `group` (custom resources too)."""
    custom = {k: v for k, v in group.resources.items() if k not in ("CPU", "GPU")}
    return {"num_cpus": group.resources.get("CPU", 0), "num_gpus": group.resources.get("GPU", 0),
            **({"resources": custom} if custom else {})}
