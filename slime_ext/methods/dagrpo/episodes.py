"""What DA-GRPO reads from a multi-turn episode (the cloud as a tool): whether it asked the cloud, whether the
cloud answered, and the text the reward scores.

An episode's turn records (`Sample.metadata["env"]["turn_records"]`, `EpisodeResult.stats()`) hold each turn's
offsets in the response and the environment's `info`; a turn that called the cloud has `info.tool == "cloud"`
and the call's `result`. The scored text is what the model wrote: every turn's generated tokens decoded, with
its tool calls taken out (as the splice path takes the trigger out), the observations left out (the cloud's
words answer only through what the model writes after reading them).
"""

from __future__ import annotations

from typing import Any, Sequence

from slime_ext.envs.tool_call import without_calls
from slime_ext.envs.toolbox import BUSY, OK, UNKNOWN
from slime_ext.methods.dagrpo.cloud_tool import NAME

NOT_RUN = (UNKNOWN, BUSY)  # results of a call that never reached the tool


def cloud_calls(turn_records: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The `info` of each turn whose cloud call reached the tool (a call in a turn no turn follows is not run;
    one the toolbox refused never reached it)."""
    infos = [t.get("info") or {} for t in turn_records]
    return [i for i in infos if i.get("tool") == NAME and not i.get("unanswered") and i.get("result") not in NOT_RUN]


def asked_cloud(turn_records: Sequence[dict[str, Any]]) -> bool:
    """Whether the episode used the cloud: the cost c = 1."""
    return bool(cloud_calls(turn_records))


def cloud_answered(turn_records: Sequence[dict[str, Any]]) -> bool:
    """Whether a cloud call of the episode came back with the cloud's completion."""
    return any(i.get("result") == OK for i in cloud_calls(turn_records))


def model_text(response_ids: Sequence[int], turn_records: Sequence[dict[str, Any]], tokenizer: Any) -> str:
    """The model's own text of the episode: each turn's generated ids decoded, tool calls taken out, joined."""
    parts = []
    for t in turn_records:
        ids = list(response_ids[t["start"]: t["start"] + t["generated"]])
        parts.append(without_calls(tokenizer.decode(ids, skip_special_tokens=True)))
    return "".join(parts)


def turn_records(sample: Any) -> list[dict[str, Any]]:
    """A sample's turn records; a sample without them did not come from an episode (an error here)."""
    env = sample.metadata.get("env")
    if env is None:
        raise ValueError(f"sample {sample.sample_id!r} holds no episode (metadata['env']): DA-GRPO's tool path "
                         "scores multi-turn episodes (rollout.env)")
    return list(env["turn_records"])
