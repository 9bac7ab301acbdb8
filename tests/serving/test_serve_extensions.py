"""Request extensions of the OpenAI routes come from the method registry only: the server code names none.
An extension registered at run time is served by its body field, reads its own options from the body, and
the routes' rules for extensions apply (no logprobs with one, one extension per request)."""

from __future__ import annotations

from typing import Any, Callable, Optional

import json

import httpx
import pytest

from slime_ext.methods import registry
from tests.serving.serve_stub import running


class Shout:
    """A test extension: the answer upper-cased, `shout_level` from the body repeated as '!'."""

    made = 0

    def __init__(self, tokenizer: Any):
        self.tokenizer = tokenizer
        Shout.made += 1
        self.level = 0

    def sampler_spec(self, body: Optional[dict[str, Any]] = None) -> dict:
        self.level = int((body or {}).get("shout_level", 1))
        return {"kind": "shout_test"}

    def visible_text(self, result: Any) -> str:
        return self.tokenizer.decode(result.output_ids).upper() + "!" * self.level

    def tracker(self) -> Callable[[int], bool]:
        return lambda tok: tok != ord("b")  # the stream leaves out every "b"


@pytest.fixture
def extensions():
    registry.register_method("shout_test", registry.MethodEntry(
        "slime_ext.methods.grpo.method:GRPO", serving={"shout": f"{__name__}:Shout", "whisper": f"{__name__}:Shout"}))
    yield
    registry.METHODS.pop("shout_test")


def _completion(c: httpx.Client, **extra: Any) -> httpx.Response:
    return c.post("/v1/completions", json={"prompt": "hi", "max_tokens": 3, "seed": 1, **extra})


def test_a_registered_extension_is_served_by_its_field_with_its_own_options(extensions):
    with running() as (srv, _, _):
        with httpx.Client(base_url=srv.url, timeout=30) as c:
            plain = _completion(c).json()["choices"][0]["text"]
            loud = _completion(c, shout=True, shout_level=2).json()["choices"][0]["text"]
            streamed = c.post("/v1/completions", json={"prompt": "hi", "max_tokens": 3, "seed": 1, "stream": True,
                                                        "shout": True}).text
            ignored = _completion(c, shout=False, something_else=1).json()["choices"][0]["text"]
    assert len(plain) == 3 and loud == plain.upper() + "!!" and ignored == plain
    chunks = [json.loads(line[6:]) for line in streamed.split("\n") if line.startswith("data: {")]
    assert "".join(ch["choices"][0]["text"] for ch in chunks) == plain.replace("b", "")  # the tracker's view


def test_extension_rules_logprobs_and_combinations(extensions):
    with running() as (srv, _, _):
        with httpx.Client(base_url=srv.url, timeout=30) as c:
            with_logprobs = _completion(c, shout=True, logprobs=0)
            both = _completion(c, shout=True, whisper=True)
    assert with_logprobs.status_code == 400 and "logprobs are not supported with shout" in with_logprobs.text
    assert both.status_code == 400 and "cannot be combined" in both.text


def test_an_unregistered_field_is_ignored_not_served():
    with running() as (srv, _, _):
        with httpx.Client(base_url=srv.url, timeout=30) as c:
            r = _completion(c, shout=True)
    assert r.status_code == 200 and r.json()["choices"][0]["text"] != r.json()["choices"][0]["text"].upper() + "!"
