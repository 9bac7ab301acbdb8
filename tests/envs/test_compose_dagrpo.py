"""DA-GRPO with the cloud as a tool of the `tools` environment (issue 31, item 6): the tool path against the splice
path on one scripted policy, the tool path's own numbers by hand, the warm start's asking rows, and the config.

The engine is scripted (no model): per request it writes the text its policy gives for that request, token by
token in a character tokenizer, through the real per-request samplers (the help trigger on the splice path) and
the real stop checks (the tool call's `</input>` on the tool path). The cloud is a fake client that records what
it was asked."""

from __future__ import annotations

import random
import re
import threading
from typing import Callable

import pytest
import torch

from slime_ext.clients.openai_client import CallFailed, ChatResult
from slime_ext.config import ConfigError, load_config
from slime_ext.methods.dagrpo.cloud import CloudHelper
from slime_ext.methods.dagrpo.method import DAGRPO
from slime_ext.orchestration.rollout_manager import RolloutManager
from tests.conftest import CONFIGS
from tests.tools.test_eval_checkpoint import tiny_checkpoint  # noqa: F401 (a fixture of the checkpoint test)
from tests.scripted_decode import decode_scripted

EOS = 0
TRIGGER = "I need external assistance."
CALL = f"<tool>cloud</tool><input>{TRIGGER}</input>"
NUMBERS = re.compile(r"q(\d+): what is (\d+) plus (\d+)\?")


class CharTokenizer:
    """Code points as ids, 0 the end of sequence (what the engine, the loop and the method all tokenise with)."""

    eos_token_id = pad_token_id = EOS

    def __call__(self, text: str, add_special_tokens: bool = True) -> dict:
        return {"input_ids": [ord(c) for c in text]}

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        return "".join(chr(i) for i in ids if i != EOS)


TOK = CharTokenizer()


def rows(n: int) -> list[dict]:
    out = []
    for i in range(n):
        a, b = 10 + 7 * i, 3 + 5 * i
        out.append({"prompt": f"q{i}: what is {a} plus {b}?", "label": str(a + b), "row_id": i})
    return out


def answer_of(question: str) -> int:
    _, a, b = NUMBERS.search(question).groups()
    return int(a) + int(b)


class FakeCloud:
    """`chat_many` of an OpenAI client: the exact answer as `\\boxed{N}`, or a failure for questions of `fail`."""

    def __init__(self, fail: tuple[str, ...] = ()):
        self.fail, self.asked, self._lock = fail, [], threading.Lock()

    def __getstate__(self) -> dict:  # picklable, as the real client (the method travels to the manager actor)
        return {k: v for k, v in self.__dict__.items() if k != "_lock"}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state, _lock=threading.Lock())

    def chat_many(self, conversations, **params):
        out = []
        for conv in conversations:
            question = conv[0]["content"]
            with self._lock:
                self.asked.append(question)
            failed = any(f in question for f in self.fail)
            out.append(CallFailed("down") if failed else ChatResult(f"\\boxed{{{answer_of(question)}}}", "stop"))
        return out


class ScriptedEngine:
    """`policy(rid, input text, seed)` -> the text the model writes next; emitted token by token through the
    request's samplers and stop checks, as the embedded engine's `_decide` does (a finishing sampler forces EOS)."""

    def __init__(self, policy: Callable[[str, str, int], str]):
        self.policy = policy

    def generate(self, requests):
        out = []
        logits = torch.zeros(8)
        for req in requests:
            stream = [ord(c) for c in self.policy(req.rid, TOK.decode(req.input_ids), req.seed)] + [EOS]
            out.append(decode_scripted(req, stream, logits, EOS, TOK.decode, -0.1))
        return out


def config(name: str, *overrides: str):
    base = ["rollout.manager=driver", "rollout.prompts_per_step=3", "rollout.n_samples_per_prompt=4",
            "dagrpo.phases=[]", "dagrpo.lambda_init=0.5", "dagrpo.eta_lambda=0.5"]
    return load_config(CONFIGS / name, base + list(overrides)).config


def manager(cfg, engine, cloud: FakeCloud, n_rows: int = 3) -> RolloutManager:
    method = DAGRPO(cfg, TOK, cloud=CloudHelper(cloud))
    return RolloutManager(cfg, rows(n_rows), TOK, engine, method=method)


# -- the tool path against the splice path -------------------------------------------------------------
def seeded_policy(tool: bool) -> Callable[[str, str, int], str]:
    """One policy, written for either path. From the request seed: ask (p 0.4), else answer alone, right (p 0.6)
    with steps, or wrong. Asking: one step, then the trigger (splice) or the cloud call with the trigger as its
    argument (tool); after the cloud's observation the model writes what it read (tool path, next turn)."""

    def policy(rid: str, text: str, seed: int) -> str:
        response = text.split("Answer:\n", 1)[1]
        if "<output>" in response:  # the cloud answered: copy its boxed answer
            return re.findall(r"<output>\n(.*?)\n</output>", response)[-1]
        rng = random.Random(seed)
        right = answer_of(text)
        if rng.random() < 0.4:
            return "Step 1: I start.\n" + (CALL + " junk after the stop" if tool else TRIGGER + " and then more")
        value = right if rng.random() < 0.6 else right + 1
        return f"Step 1: it is {value}.\n\\boxed{{{value}}}"

    return policy


def test_the_tool_path_gives_the_splice_paths_costs_rewards_advantages_and_lambda():
    """On a policy that asks in the same episodes on both paths and, on the tool path, writes the cloud's answer
    after reading it: the same asked flags (costs), rewards, dual advantages, cloud calls (one per group that
    asked, the same questions), metrics and lambda, over two steps (the second uses the updated lambda). The token
    sequences differ as documented: the splice path appends the cloud's tokens (masked) after the trigger; the
    tool path holds the call, the observation (masked) and the model's next turn (trained)."""
    clouds = {"splice": FakeCloud(), "tool": FakeCloud()}
    managers = {"splice": manager(config("dagrpo.yaml"), ScriptedEngine(seeded_policy(False)), clouds["splice"]),
                "tool": manager(config("dagrpo_tools.yaml"), ScriptedEngine(seeded_policy(True)), clouds["tool"])}
    asked_total = 0
    for step in range(2):
        out = {path: m.rollout(step) for path, m in managers.items()}
        (splice_groups, sm), (tool_groups, tm) = out["splice"], out["tool"]
        splice = {s.sample_id: s for g in splice_groups for s in g}
        tool = {s.sample_id: s for g in tool_groups for s in g}
        assert sorted(splice) == sorted(tool) and len(splice) == 12
        for sid, a in splice.items():
            b = tool[sid]
            assert (a.cost, a.reward, a.rewards, a.response_text) == (b.cost, b.reward, b.rewards, b.response_text), sid
            assert a.advantage == pytest.approx(b.advantage, abs=1e-12), sid
            if a.cost:  # the documented difference: where the cloud's tokens sit and what follows them
                cloud = len("\\boxed{}") + len(a.label) + 1  # its completion, re-tokenised, + EOS
                assert a.loss_mask == [1.0] * (a.response_len - cloud) + [0.0] * cloud
                observation = len("\n<output>\n\n</output>\n") + len("\\boxed{}") + len(b.label)
                assert b.loss_mask.count(0.0) == observation and b.metadata["env"]["turns"] == 2
                assert b.loss_mask[-1] == 1.0 and b.metadata["cloud_answered"] and a.metadata["cloud_answered"]
            else:
                assert a.response_ids == b.response_ids and b.metadata["env"]["turns"] == 1
        asked = sum(s.cost for s in splice.values())
        asked_total += asked
        keys = ("dagrpo/cloud_rate", "dagrpo/cloud_calls", "dagrpo/cloud_calls_per_group", "dagrpo/cloud_failures",
                "dagrpo/groups_split_on_asking", "dagrpo/local_only_accuracy", "dagrpo/lambda", "reward/mean",
                "reward/correct", "reward/format")
        assert {k: sm[k] for k in keys} == pytest.approx({k: tm[k] for k in keys}, nan_ok=True)
        assert sm["dagrpo/cloud_rate"] == asked / 12
        groups_asking = sum(any(s.cost for s in g) for g in splice_groups)
        assert sm["dagrpo/cloud_calls"] == tm["dagrpo/cloud_calls"] == groups_asking
        assert tm["env/tool_calls_mean"] == pytest.approx(asked / 12)  # one call per asking episode
        for path, m in managers.items():
            m.update({}, step)
        assert managers["splice"].method.lam == managers["tool"].method.lam
    assert asked_total >= 4 and 0 < sum(1 for s in splice.values() if s.reward == 1.0) < 12  # not a vacuous run
    assert sorted(clouds["splice"].asked) == sorted(clouds["tool"].asked) and len(clouds["tool"].asked) >= 2


# -- the tool path's own numbers -----------------------------------------------------------------------
SCRIPTS = {  # (question, sample) -> the model's text in turns 0, 1, 2
    # q0: 10 + 3 = 13; the cloud answers \boxed{13}
    (0, 0): ["Step 1: I start.\n" + CALL, "\\boxed{13}"],  # asks, writes the cloud's answer: r 1, c 1
    (0, 1): ["Step 1: try.\n<tool>calculator</tool><input>10*3</input>",  # calculator, then the cloud in turn 1
             "<tool>cloud</tool><input>help</input>", "\\boxed{7}"],  # (the group's call, shared), wrong: r 0, c 1
    (0, 2): ["Step 1: 10 + 3 = 13.\n\\boxed{13}"],  # alone, right: r 1, c 0
    (0, 3): [f"{TRIGGER}\n\\boxed{{5}}"],  # the trigger as text is no call: r 0, c 0
    # q1: 17 + 8 = 25; the cloud fails
    (1, 0): ["Step 1: I start.\n" + CALL, "\\boxed{25}"],  # asks (no answer), right anyway: r 1, c 1
    (1, 1): ["Step 1: add.\n<tool>calculator</tool><input>17+8</input>", "\\boxed{25}"],  # calculator only: r 1, c 0
    (1, 2): ["Step 1: add.\n<tool>calculator</tool><input>17+8</input>", "Step 2: hmm.\n<tool>calculator</tool>"
             "<input>1+1</input>", "Step 3: ask.\n" + CALL],  # its cloud call is in the last turn: not run, c 0, r 0
    (1, 3): ["\\boxed{12}"],  # alone, wrong: r 0, c 0
}


def scripted_policy(rid: str, text: str, seed: int) -> str:
    q = int(NUMBERS.search(text).group(1))
    k = int(re.search(r"-k(\d+)", rid).group(1))
    turn = int(re.search(r"-t(\d+)$", rid).group(1)) if re.search(r"-t\d+$", rid) else 0
    text = SCRIPTS[(q, k)][turn]
    return text + " tail" if text.endswith("</input>") else text  # the stop string ends the turn before the tail


def test_the_tool_paths_costs_rewards_advantages_and_cloud_calls_by_hand():
    """Two prompts x 4 episodes (SCRIPTS), lambda 0.5, no std normalisation; the cost is read from the episodes'
    tool calls (a cloud call that ran), never from the text or from other tools' calls.
      q0: r = [1, 0, 1, 0], c = [1, 1, 0, 0]: A = (r - 1/2) - 1/2 (c - 1/2) = [0.25, -0.75, 0.75, -0.25]
      q1: r = [1, 1, 0, 0], c = [1, 0, 0, 0]: A = (r - 1/2) - 1/2 (c - 1/4) = [0.125, 0.625, -0.375, -0.375]
    cloud rate 3/8; one call per group that asked (q0's two askers, in turns 0 and 1, share one), q1's failed;
    lambda <- 0.5 + 0.5 (3/8 - 0) = 0.6875 (no phase: tau 0)."""
    cloud = FakeCloud(fail=("q1:",))
    cfg = config("dagrpo_tools.yaml", "rollout.prompts_per_step=2", "rollout.max_turns=3", "grpo.normalize_std=false",
                 "rollout.max_response_len=320", "rollout.env_settings.tools=[cloud,calculator]")
    m = manager(cfg, ScriptedEngine(scripted_policy), cloud, n_rows=2)
    groups, metrics = m.rollout(0)
    by = {(int(NUMBERS.search(g[0].metadata["question"]).group(1)), int(s.sample_id.rsplit("k", 1)[1])): s
          for g in groups for s in g}
    want = {(0, 0): (1, 1, 0.25), (0, 1): (0, 1, -0.75), (0, 2): (1, 0, 0.75), (0, 3): (0, 0, -0.25),
            (1, 0): (1, 1, 0.125), (1, 1): (1, 0, 0.625), (1, 2): (0, 0, -0.375), (1, 3): (0, 0, -0.375)}
    for key, (r, c, a) in want.items():
        s = by[key]
        assert (s.reward, s.cost) == (r, c), key
        assert s.advantage == pytest.approx(a, abs=1e-12), key
    assert by[(0, 0)].response_text == "Step 1: I start.\n\\boxed{13}"  # the model's own text, the call taken out
    assert by[(0, 1)].response_text == "Step 1: try.\n\\boxed{7}"
    assert by[(1, 2)].metadata["env"]["turn_records"][-1]["info"] == {"tool": "cloud", "unanswered": True}
    assert by[(0, 1)].metadata["cloud_answered"] and not by[(1, 0)].metadata["cloud_answered"]
    # the observation tokens are masked and nothing else: q0's cloud answer "\n<output>\n\boxed{13}\n</output>\n"
    assert by[(0, 0)].loss_mask.count(0.0) == 31 and by[(0, 0)].response_len == len("Step 1: I start.\n" + CALL) + 31 + 11
    assert sorted(cloud.asked) == ["q0: what is 10 plus 3?", "q1: what is 17 plus 8?"]
    assert metrics["dagrpo/cloud_rate"] == 3 / 8 and metrics["dagrpo/cloud_calls"] == 2
    assert metrics["dagrpo/cloud_failures"] == 1 and metrics["dagrpo/cloud_failure_rate"] == 0.5
    assert metrics["dagrpo/cloud_calls_per_group"] == 1.0 and metrics["dagrpo/groups_split_on_asking"] == 1.0
    assert metrics["dagrpo/local_only_accuracy"] == pytest.approx(2 / 5) and metrics["reward/mean"] == 0.5
    assert metrics["env/tool_calls_mean"] == pytest.approx(7 / 8)  # calls run: q0 1, 2, 0, 0; q1 1, 1, 2, 0
    m.update({}, 0)
    assert m.method.lam == pytest.approx(0.6875)


# -- evaluation, warm start, pickling, config ------------------------------------------------------------
def test_phase_evaluation_runs_episodes_with_the_cloud_tool():
    """`evaluate_rows` (the phase evaluations) on the tool path: one greedy episode per prompt, the cloud asked once
    per prompt that called it; joint accuracy scores the model's own text. SCRIPTS' sample 0 of each question:
    q0 asks and copies the answer (right), q1 asks, gets no answer and is right anyway (its call failed)."""
    cloud = FakeCloud(fail=("q1:",))
    cfg = config("dagrpo_tools.yaml", "rollout.max_turns=3", "rollout.env_settings.tools=[cloud,calculator]",
                 "rollout.max_response_len=320")
    method = DAGRPO(cfg, TOK, cloud=CloudHelper(cloud))
    records: list[dict] = []
    engine = ScriptedEngine(lambda rid, text, seed: scripted_policy(rid.replace("dg-eval-", "-k0-"), text, seed))
    out = method.evaluate_rows(engine, rows(2), "plain", baselines=False, records=records)
    assert out["cloud_rate"] == 1.0 and out["joint_accuracy"] == 1.0 and out["cloud_calls"] == 2.0
    assert out["cloud_failures"] == 1.0 and out["local_only_accuracy"] != out["local_only_accuracy"]  # nan: none local
    assert [(r["asked"], r["cloud_answered"], r["correct"]) for r in records] == [(True, True, 1.0), (True, False, 1.0)]
    assert records[0]["length"] == len("Step 1: I start.\n" + CALL) + len("\\boxed{13}") + 1  # generated, not observed


def test_the_warm_start_asks_by_a_call_whose_observation_is_not_trained():
    from slime_ext.tasks.response_tokens import sft_response
    from slime_ext.methods.dagrpo.core import with_trigger_examples

    row = {"prompt": "p", "label": "7", "solution": "Step 1: 3 + 4 = 7.\n\\boxed{7}", "id": 1}
    splice_rows = with_trigger_examples([row], TRIGGER, 1.0)
    tool_rows = with_trigger_examples([row], TRIGGER, 1.0, tool="cloud")
    assert splice_rows[0]["solution"] == f"Step 1: 3 + 4 = 7.\n{TRIGGER}"
    observation = "\n<output>\n\\boxed{7}\n</output>\n"
    assert tool_rows[0]["solution"] == f"Step 1: 3 + 4 = 7.\n{CALL}{observation}\\boxed{{7}}"
    ids, mask = sft_response(TOK, tool_rows[0])
    head = len(f"Step 1: 3 + 4 = 7.\n{CALL}")
    assert mask == [1.0] * head + [0.0] * len(observation) + [1.0] * (len("\\boxed{7}") + 1)
    tool_cfg, splice_cfg = config("dagrpo_tools.yaml"), config("dagrpo.yaml")
    tool_key = DAGRPO(tool_cfg, TOK, cloud=CloudHelper(FakeCloud())).warm_start_key()
    assert tool_key[-1] == "cloud" and tool_key[:-1] == DAGRPO(splice_cfg, TOK, cloud=CloudHelper(FakeCloud())).warm_start_key()


def test_the_method_with_its_cloud_tool_pickles_without_the_batchs_calls():
    """The method (and the tool it lends) travels to the rollout manager actor."""
    import pickle

    cloud = FakeCloud()
    m = manager(config("dagrpo_tools.yaml"), ScriptedEngine(seeded_policy(True)), cloud)
    m.rollout(0)
    tool = m.method.cloud_tool()
    assert tool.tally().calls >= 1
    clone = pickle.loads(pickle.dumps(m.method))
    assert clone.cloud_tool().tally().calls == 0 and clone.cloud_tool().cloud is clone.cloud
    assert clone.env_tools()["cloud"] is clone.cloud_tool()


@pytest.mark.parametrize("name, overrides, message, keys", [
    ("dagrpo.yaml", ["rollout.env=tools"], "needs the cloud tool", "rollout.env"),
    ("dagrpo_tools.yaml", ["rollout.env_settings.tools=[calculator]"], "needs the cloud tool",
     "rollout.env_settings.tools=[calculator]"),
    ("dagrpo_tools.yaml", ["dagrpo.local_only=true"], "dagrpo.local_only = true but rollout.env_settings.tools",
     "dagrpo.local_only=true"),
    ("grpo_tools.yaml", ["rollout.env_settings.tools=[calculator,cloud]"], r"offers \['cloud'\], which only methods "
     r"\['collab_grpo', 'dagrpo'\] lend", "rollout.env_settings.tools"),
])
def test_impossible_tool_path_configs_are_rejected_naming_the_key(name, overrides, message, keys):
    with pytest.raises(ConfigError, match=message) as err:
        load_config(CONFIGS / name, overrides)
    assert keys in str(err.value)


def test_the_shipped_tool_config_and_the_lent_tool():
    from slime_ext.envs.registry import build_env, known_tools

    cfg = load_config(CONFIGS / "dagrpo_tools.yaml", []).config
    assert (cfg.method, cfg.rollout.env, cfg.rollout.env_settings) == ("dagrpo", "tools", {"tools": ["cloud"]})
    assert "cloud" in known_tools()
    method = DAGRPO(cfg, TOK, cloud=CloudHelper(FakeCloud()))
    env = build_env(cfg.rollout.env, cfg.rollout.env_settings, TOK, method.env_tools())
    assert env.toolbox.tools == {"cloud": method.cloud_tool()}
    with pytest.raises(ValueError, match="tool 'cloud' is one a method lends"):
        build_env(cfg.rollout.env, cfg.rollout.env_settings, TOK)


def test_checkpoint_evaluation_of_a_tool_path_run_builds_the_lent_cloud_tool(tiny_checkpoint, tmp_path):
    """`eval_checkpoint --config configs/dagrpo_tools.yaml`: every request an episode whose environment offers the
    cloud tool the run's method lends (the method is built for it, its solver cloud started in-process); without
    the lent tool the environment could not be built."""
    import json

    from slime_ext.tools.eval_checkpoint import main
    from tests.tools.test_eval_checkpoint import cli_overrides

    out = tmp_path / "out"
    rc = main([str(tiny_checkpoint), "--no-progress", "--config", str(CONFIGS / "dagrpo_tools.yaml"), "--out",
               str(out), *cli_overrides(tmp_path), "rollout.max_total_tokens=6"])
    assert rc == 0
    meta = json.loads((out / "eval.json").read_text())["meta"]
    assert set(meta["response_metrics"]) >= {"turns", "tool_calls", "called_tool"}
