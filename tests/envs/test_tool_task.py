"""The tools task end to end below the job: every tool level's reference solution, played through the real
`tools` environment by a scripted model, is an episode whose tokens and loss mask equal the SFT response built
from the same solution (slime_ext/tasks/response_tokens.py) and whose answer scores 1; a tool that answers wrong
gets 0. And the SFT batch of a tool row has loss mask 0 exactly on the observation tokens."""

from __future__ import annotations

import re

import pytest
import torch

from sglang_patches.decoding import SamplingParams
from slime_ext.data.batch import build_batch
from slime_ext.data.generation import GenerateRequest, GenerateResult
from slime_ext.envs import registry
from slime_ext.envs.calculator import CalculatorTool
from slime_ext.envs.rollout import EpisodeLimits, observation_ids, run_episodes
from slime_ext.envs.tool_call import format_observation
from slime_ext.envs.toolbox import Tool
from slime_ext.envs.tools_env import ToolsEnv
from slime_ext.envs.tools_settings import ToolsSettings
from slime_ext.orchestration.training_job import sft_samples
from slime_ext.rewards import get_verifier
from slime_ext.tasks.lengths import prompt_token_ids, sft_token_ids
from slime_ext.tasks.response_tokens import solution_pieces, sft_response
from slime_ext.tasks.synthetic_math import TOOL_LEVELS, generate_dataset
from slime_ext.tasks.tool_solutions import with_tool_solution
from slime_ext.tokenizer import train_tokenizer

OUTPUT = re.compile(r"<output>\n(.*?)\n</output>", re.DOTALL)


@pytest.fixture(scope="module")
def tok():
    rows = [with_tool_solution(r, tool) for tool in ("calculator", "python")
            for r in generate_dataset(list(TOOL_LEVELS), 400, seed=5, split="train")]
    return train_tokenizer([r["prompt"] + "\n" + r["solution"] for r in rows], vocab_size=400)


def tool_rows(level: str, tool: str, n: int) -> list[dict]:
    return [with_tool_solution(r, tool) for r in generate_dataset([level], n, seed=0, split="eval")]


class ScriptedModel:
    """Turn 0: the reference solution's call, token for token as SFT teaches it. Turn 1: `\\boxed{N}` with N what
    the last observation printed, then EOS, whatever it was (a model that trusts its tool)."""

    def __init__(self, tok, row_of):
        self.tok, self.row_of = tok, row_of

    def ids(self, text: str) -> list[int]:
        return list(self.tok(text, add_special_tokens=False)["input_ids"])

    def generate(self, requests):
        out = []
        for q in requests:
            rid, _, turn = q.rid.partition("-t")
            if not turn:
                ids = self.ids(solution_pieces(self.row_of(rid)["solution"])[0][0])
            else:
                seen = self.tok.decode(q.input_ids)
                ids = self.ids(f"\\boxed{{{OUTPUT.findall(seen)[-1].strip()}}}") + [self.tok.eos_token_id]
            out.append(GenerateResult(q.rid, ids, [0.0] * len(ids), "stop", [], 0, len(q.input_ids)))
        return out


def play(tok, rows: list[dict], tool: str):
    env = ToolsEnv(ToolsSettings(tools=[tool]), tok)
    requests = [GenerateRequest(f"r{i}", prompt_token_ids(tok, "plain", r["prompt"]),
                                SamplingParams(temperature=1.0, max_new_tokens=192), seed=i)
                for i, r in enumerate(rows)]
    model = ScriptedModel(tok, lambda rid: rows[int(rid[1:])])
    return run_episodes(model.generate, requests, rows, env, tok, EpisodeLimits(3, 192))


@pytest.mark.parametrize("level, tool, n", [("T1", "calculator", 40), ("T2", "calculator", 40), ("T1", "python", 4),
                                            ("T2", "python", 4)])
def test_the_reference_through_the_tools_env_is_the_sft_response_and_scores_1(tok, level, tool, n):
    rows = tool_rows(level, tool, n)
    verify = get_verifier("math")
    for row, episode in zip(rows, play(tok, rows, tool)):
        assert (episode.finish, episode.tool_calls, episode.tool_errors, len(episode.turns)) == ("done", 1, 0, 2)
        ids, mask = sft_response(tok, row)
        # same tokens at the same places, same mask: SFT teaches exactly what a rollout of this solution holds
        assert episode.response_ids == ids and episode.loss_mask == mask, row["id"]
        assert verify(episode.final_text, row["label"]).score == 1.0
        assert verify(row["solution"], row["label"]).score == 1.0  # check_references' view


class WrongCalculator(Tool):
    """Answers every expression one too high."""

    def __init__(self, settings=None):
        super().__init__(settings)
        self.inner = CalculatorTool(settings)

    def run(self, arg: str) -> str:
        return str(int(self.inner.run(arg)) + 1)


@pytest.mark.parametrize("level", list(TOOL_LEVELS))
def test_a_wrong_tool_result_scores_0(tok, level, monkeypatch):
    monkeypatch.setitem(registry.TOOLS, "calculator", "tests.envs.test_tool_task:WrongCalculator")
    rows = tool_rows(level, "calculator", 20)
    verify = get_verifier("math")
    for row, episode in zip(rows, play(tok, rows, "calculator")):
        assert episode.tool_calls == 1 and episode.tool_errors == 0
        assert episode.final_text == f"\\boxed{{{int(row['label']) + 1}}}"
        assert verify(episode.final_text, row["label"]).score == 0.0


def test_the_solution_observation_is_the_environments():
    row = tool_rows("T1", "calculator", 1)[0]
    (_, _), (observation, trained), (_, _) = solution_pieces(row["solution"])
    assert not trained and observation == format_observation(row["label"] + "\n", False)


def test_the_sft_batch_of_a_tool_row_masks_exactly_the_observation_tokens(tok):
    rows = tool_rows("T2", "calculator", 3) + generate_dataset(["T2"], 1, seed=0, split="eval")  # + a step row
    samples = sft_samples(rows, tok, "plain", 448, "sft0-")
    batch = build_batch(samples, pad_id=tok.pad_token_id)
    for b, (row, s) in enumerate(zip(rows, samples)):
        p, r = len(s.prompt_ids), len(s.response_ids)
        mask = batch.loss_mask[b]
        assert torch.all(mask[:p] == 0) and torch.all(mask[p + r:] == 0)
        if "tool" not in row:  # a row without tool calls: its tokens and all-ones mask as before
            assert s.response_ids == sft_token_ids(tok, row) and s.loss_mask == [1.0] * r
            continue
        pieces = solution_pieces(row["solution"])
        call = len(tok(pieces[0][0], add_special_tokens=False)["input_ids"])
        obs = observation_ids(tok, pieces[1][0])
        assert s.response_ids[call:call + len(obs)] == obs
        expected = torch.ones(r)
        expected[call:call + len(obs)] = 0
        assert torch.equal(mask[p:p + r], expected), row["id"]
        assert batch.tokens[b, p + call:p + call + len(obs)].tolist() == obs


def test_a_tool_row_cut_at_the_length_limit_keeps_its_mask_aligned(tok):
    row = tool_rows("T1", "calculator", 1)[0]
    prompt = prompt_token_ids(tok, "plain", row["prompt"])
    (s,) = sft_samples([row], tok, "plain", len(prompt) + 25, "cut-")
    ids, mask = sft_response(tok, row)
    assert s.response_ids == ids[:25] and s.loss_mask == mask[:25]


def test_evaluation_runs_episodes_and_scores_the_last_turn(tok):
    """A run with rollout.env evaluates each held-out request as an episode (TrainingJob.evaluate): the verifier
    reads the last turn, and the report's meta holds the episodes' turns and tool calls."""
    from slime_ext.config import load_config
    from slime_ext.envs.episode_engine import episode_evaluation
    from slime_ext.evaluation import evaluate, request_row
    from tests.conftest import CONFIGS

    cfg = load_config(CONFIGS / "grpo_tools.yaml", ["eval.n_samples=2", "eval.k=[1,2]"]).config
    rows = tool_rows("T1", "calculator", 5)
    row_of = lambda rid: rows[request_row(rid)]  # noqa: E731
    engine, options = episode_evaluation(ScriptedModel(tok, row_of), cfg.rollout, tok, row_of, {})
    report = evaluate(engine, tok, rows, cfg.eval, max_new_tokens=cfg.rollout.max_response_len, progress=False,
                      **options)
    assert report.mean_at_k[1] == report.greedy == 1.0
    assert report.meta["response_metrics"] == {"turns": 2.0, "tool_calls": 1.0, "tool_errors": 0.0, "called_tool": 1.0}
    single = evaluate(ScriptedModel(tok, row_of), tok, rows, cfg.eval, progress=False)  # one turn: the call only
    assert single.mean_at_k[1] == 0.0


def test_the_length_check_counts_the_ids_the_sft_batch_trains(tok):
    """One length rule for a tool row: the check that skips SFT rows too long for the context counts the response
    the SFT batch holds (piece by piece), which here is one token longer than the solution tokenised as one string
    (`</input>` + `\\n<output>` would share a `>\\n` token). A context one token short of it skips the row."""
    from slime_ext.envs.tool_call import CALL_END
    from slime_ext.tasks import response_tokens
    from slime_ext.tasks.dataset import LoadReport
    from slime_ext.tasks.lengths import SFT_TOO_LONG, LengthLimits, drop_too_long

    assert response_tokens.CALL_END == CALL_END
    rows = tool_rows("T1", "calculator", 5)
    for row in rows:
        prompt = prompt_token_ids(tok, "plain", row["prompt"])
        (s,) = sft_samples([row], tok, "plain", 10_000, "n-")
        assert s.response_ids == sft_token_ids(tok, row)
        assert len(s.response_ids) == len(tok(row["solution"])["input_ids"]) + 1 + 1  # + EOS, + the unshared token
        fits = len(prompt) + len(s.response_ids)
        short = {"prompt": "1 + 1", "label": "2"}  # fits any of these contexts: drop_too_long must keep a row
        for context, skipped in ((fits, 0), (fits - 1, 1)):
            report = LoadReport("rows.jsonl", n_rows_ok=2)
            out = drop_too_long([row, short], tok, "plain", LengthLimits(10_000, context), report)
            assert out == ([short] if skipped else [row, short])
            assert report.skipped_by_reason.get(SFT_TOO_LONG, 0) == skipped
