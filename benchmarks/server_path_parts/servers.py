"""Engine servers for the benchmark: started as the loop starts them (`EngineServerActor`, optionally traced
or with extra flags), started and stopped together, and the `ServerEnginePool` over them."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any, Callable, Optional

from benchmarks.server_path_parts.traced import TRACE_FLAG

ENTRY = Path(__file__).resolve().parents[1] / "server_path.py"  # runs `serve_traced` when given TRACE_FLAG
_START_LOCK = threading.Lock()


def start_servers(actors: list) -> Callable[[], None]:
    """Start the servers at once; returns the function that stops them. Each is started from its own
    thread, which lives until the stop: a server gets SIGTERM when the thread that started it ends
    (PR_SET_PDEATHSIG in EngineServerActor)."""
    release = threading.Event()
    errors: list[BaseException] = []
    started = [threading.Event() for _ in actors]

    def keep(a: Any, done: threading.Event) -> None:
        try:
            a.start()
        except BaseException as exc:  # noqa: BLE001 - raised in the caller
            errors.append(exc)
        done.set()
        release.wait()

    keepers = [threading.Thread(target=keep, args=(a, e), daemon=True) for a, e in zip(actors, started)]
    for t in keepers:
        t.start()
    for e in started:
        e.wait()

    def stop() -> None:
        stoppers = [threading.Thread(target=a.stop) for a in actors]
        for t in stoppers:
            t.start()
        for t in stoppers:
            t.join()
        release.set()
        for t in keepers:
            t.join()

    if errors:
        stop()
        raise errors[0]
    return stop


def server_actor(index: int, model_dir: Path, log_dir: Path, threads: int, trace_log: Optional[Path] = None,
                 extra_args: tuple[str, ...] = ()) -> Any:
    """An EngineServerActor as the loop makes them; with `trace_log`, its server is `serve_traced`; `extra_args`
    are appended to the server's command line (e.g. `--no-continuous-batching`)."""
    import slime_ext.engine.engine_server as es
    from slime_ext.config.sections import SGLangConfig

    class Custom(es.EngineServerActor):
        def start(self, weight_version: str = es.INITIAL_VERSION) -> str:
            original = es.server_command

            def command(*a: Any, **k: Any) -> tuple[list[str], dict[str, str]]:
                argv, env = original(*a, **k)
                if trace_log is not None:
                    at = argv.index("-m")
                    assert argv[at + 1] == es.STANDIN, argv
                    argv = [argv[0], str(ENTRY), TRACE_FLAG, str(trace_log), *argv[at + 2:]]
                return [*argv, *extra_args], env

            with _START_LOCK:  # the module function is swapped only while this start builds its command
                es.server_command = command
                try:
                    return super().start(weight_version)
                finally:
                    es.server_command = original

    log_dir.mkdir(parents=True, exist_ok=True)
    cfg = SGLangConfig(num_engines=1, startup_timeout_s=180, request_timeout_s=600)
    cls = es.EngineServerActor if trace_log is None and not extra_args else Custom
    return cls(index, cfg, str(model_dir), threads=threads, log_dir=str(log_dir), use_sglang=False)


def make_pool(actors: list, model_dir: Path, weights_dir: Path, tokenizer: Any, **client: Any) -> Any:
    """A pool over `actors` with the client settings `slime_ext.orchestration.run_engine` gives the loop."""
    from slime_ext.engine.server_pool import ServerEnginePool

    kwargs = {"eos_token_id": tokenizer.eos_token_id, "tokenizer_path": str(model_dir),
              "vocab_size": len(tokenizer), "native_partner": False, **client}
    return ServerEnginePool(actors, [a.url for a in actors], actors[0].cfg, str(weights_dir), client_kwargs=kwargs)
