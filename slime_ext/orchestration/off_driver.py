"""Work that loads a whole model runs in a Ray worker on the driver's node, never in the driver.

Why: the driver's memory must not grow with the model (a 30B checkpoint is 61 GB in bf16): it sends versions
and control messages, and reads back results. Evaluations of an HF checkpoint (an SFT-only run's) get an
engine actor that generates for the driver's evaluation loop; a method's final evaluations (Tandem's axes
need the models' forwards, DA-GRPO's ask probability an engine) run whole in a task, writing their files
into the run directory on this node, which the task shares with the driver.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Iterator

from contextlib import contextmanager


def _here() -> Any:
    import ray

    return ray.util.scheduling_strategies.NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(),
                                                                        soft=False)


def _options(threads: int) -> dict[str, Any]:
    # a sliver of CPU: the trainer's ranks and the engines hold the cores; the worker only runs while they wait
    return {"num_cpus": 0.01, "scheduling_strategy": _here(),
            "runtime_env": {"env_vars": {"OMP_NUM_THREADS": str(threads), "TOKENIZERS_PARALLELISM": "false"}}}


@contextmanager
def checkpoint_engine(hf_dir: str | Path, threads: int = 1, dtype: str = "float32") -> Iterator[Any]:
    """An engine over an HF checkpoint in a Ray actor on this node (the engine interface through
    `RemoteEngine`), ended when the block ends."""
    import ray

    from slime_ext.engine.ray_engine import EmbeddedEngineActor, RemoteEngine

    handle = ray.remote(EmbeddedEngineActor).options(**_options(threads)).remote(str(hf_dir), threads, None, dtype)
    try:
        yield RemoteEngine(handle)
    finally:
        ray.kill(handle)


def run_in_worker(fn: Callable[..., Any], *args: Any, threads: int = 1) -> Any:
    """`fn(*args)` in a Ray task on this node; its result (small: reports, paths) comes back."""
    import ray

    return ray.get(ray.remote(fn).options(**_options(threads)).remote(*args))


__all__ = ["checkpoint_engine", "run_in_worker"]
