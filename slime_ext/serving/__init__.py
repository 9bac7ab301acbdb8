"""The HTTP serving stack (OpenAI-compatible + SGLang-native routes on FastAPI/uvicorn); the CLI is
`python -m slime_ext.tools.serve`. See docs/serving.md."""

from slime_ext.serving.app import build_app
from slime_ext.serving.batcher import Batcher
from slime_ext.serving.config import ServeConfig
from slime_ext.serving.runner import RunningServer, serve, serve_forever
from slime_ext.serving.state import ServerState

__all__ = ["Batcher", "RunningServer", "ServeConfig", "ServerState", "build_app", "serve", "serve_forever"]
