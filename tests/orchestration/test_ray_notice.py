"""Ray's token-authentication notice is dropped on a local start; Ray's other warnings are kept."""

from __future__ import annotations

import logging

from slime_ext.orchestration.training_job import _DropRayTokenAuthNotice


class _Collect(logging.Handler):
    def __init__(self):
        super().__init__()
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def test_ray_token_auth_notice_is_dropped_and_other_ray_warnings_kept():
    logger = logging.getLogger("ray._private.authentication.authentication_token_setup")
    collect, drop = _Collect(), _DropRayTokenAuthNotice()
    logger.addHandler(collect)
    logger.addFilter(drop)
    try:
        logger.warning("Token authentication is enabled for this Ray cluster. Set RAY_AUTH_MODE=disabled ...")
        logger.warning("Token authentication is disabled for this Ray cluster. Anyone with network access ...")
        assert [m[:40] for m in collect.messages] == ["Token authentication is disabled for thi"]
    finally:
        logger.removeHandler(collect)
        logger.removeFilter(drop)
