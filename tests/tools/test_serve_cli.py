"""The server's command line (`python -m slime_ext.tools.serve`): flags become the ServeConfig, the defaults
and the start line, and the engine servers' command parses to the batching the loop wants. The server itself
is tested in tests/serving/."""

from __future__ import annotations

import pytest

from slime_ext.serving import ServeConfig, ServerState
from tests.serving.serve_stub import StubEngine
from tests.serving.test_serve_token_bound import tokenizer  # noqa: F401 - the tiny tokenizer (a module fixture)


def test_cli_flags_become_the_config():
    from slime_ext.tools.serve import config_from, parse_args

    cfg = config_from(parse_args(["--solver", "synthetic_math", "--max-request-bytes", "1234", "--max-concurrency", "3",
                                  "--max-queue", "0", "--api-key", "k", "--context-length", "99"]))
    assert (cfg.max_request_bytes, cfg.max_concurrency, cfg.max_queue, cfg.api_key, cfg.context_length) == \
        (1234, 3, 0, "k", 99)
    with pytest.raises(ValueError):
        ServeConfig(max_concurrency=0)


def test_cli_default_and_start_line(tokenizer):
    from slime_ext.tools.serve import config_from, limits_line, parse_args

    assert config_from(parse_args(["--solver", "synthetic_math"])).max_request_bytes is None
    explicit = config_from(parse_args(["--solver", "synthetic_math", "--max-request-bytes", "777"]))
    assert explicit.max_request_bytes == 777
    engine = StubEngine()
    state = ServerState(engine, tokenizer, "tiny", config=ServeConfig(context_length=256))
    assert limits_line(state) == ("request bodies: prompt routes 105472 bytes (derived), others 4194304 bytes; "
                                  "prompts over 3328 characters (256 tokens x 13 characters per token) are refused "
                                  "before tokenising")
    state.batcher.close()


def test_engine_servers_batch_bursts():
    from slime_ext.config.sections import SGLangConfig
    from slime_ext.engine.engine_server import server_command
    from slime_ext.tools.serve import config_from, parse_args

    argv, _ = server_command(SGLangConfig(), "/m", 1234, use_sglang=False)
    cfg = config_from(parse_args(argv[3:]))
    assert (cfg.batch_window_s, cfg.batch_settle_s) == (0.02, 2.0)
