"""`solver:NAME` endpoints: an exact solver behind an in-process OpenAI-compatible server.

Any config value of a `*_url` key (DA-GRPO's cloud, an SxS judge) may be `solver:NAME`; the process that
builds the method starts (once per process) a server over `slime_ext.engine.solver.SolverEngine(NAME)`
and the method sees its http URL, so the embedded default needs no second process. Requests still go over
HTTP either way. Methods only ever see URLs. The training job builds the run's method in the driver and hands it
to the rollout manager actor, which therefore calls the driver's servers (it runs on the driver's node).
"""

from __future__ import annotations

import threading
from typing import Any, Optional

from pydantic import BaseModel

from slime_ext.methods.base import Method
from slime_ext.methods.registry import build_method

SOLVER_PREFIX = "solver:"
_servers: dict[str, str] = {}  # solver name -> URL of this process's server
_lock = threading.Lock()


def solver_url(url: str) -> str:
    """The http URL for `url`: `solver:NAME` starts the in-process server; anything else is returned as is."""
    if not url.startswith(SOLVER_PREFIX):
        return url
    name = url[len(SOLVER_PREFIX):]
    with _lock:
        if name not in _servers:
            from slime_ext.engine.solver import SolverEngine
            from slime_ext.tools.serve import ServerState, serve

            engine = SolverEngine(name)
            server = serve(ServerState(engine, engine.tokenizer, url))
            _servers[name] = f"http://127.0.0.1:{server.server_address[1]}"
        return _servers[name]


def with_local_endpoints(config: Any) -> Any:
    """A copy of `config` whose `solver:` URLs (in any section's `*_url` key) point at live servers."""
    updates: dict[str, dict[str, str]] = {}
    for section in type(config).model_fields:
        value = getattr(config, section)
        if not isinstance(value, BaseModel):
            continue
        for key in type(value).model_fields:
            url = getattr(value, key)
            if key.endswith("_url") and isinstance(url, str) and url.startswith(SOLVER_PREFIX):
                updates.setdefault(section, {})[key] = solver_url(url)
    if not updates:
        return config
    resolved = config.model_copy(deep=True)
    for section, keys in updates.items():
        for key, url in keys.items():
            setattr(getattr(resolved, section), key, url)
    return resolved


def build_run_method(config: Any, tokenizer: Optional[Any] = None) -> Method:
    """The configured method, with its `solver:` endpoints started in this process."""
    return build_method(with_local_endpoints(config), tokenizer)
