"""VLMQ_ENV=production (compose, k8s) refuses to start without secrets of the operator's own."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from shared.config import GatewaySettings, InferenceSettings

GOOD_URL = "redis://:s3cr3t-of-my-own@redis:6379/0"


def production(**values: Any) -> GatewaySettings:
    return GatewaySettings(_env_file=None, env="production", **values)  # type: ignore[call-arg]


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("redis://redis:6379/0", "needs a Redis password"),
        ("redis://:vlmq-dev-only@redis:6379/0", "needs a Redis password"),
        ("sentinel://:changeme@s1:26379;sentinel://s2:26379", "needs a Redis password"),
    ],
)
def test_a_missing_or_default_redis_password_is_refused(url: str, message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        production(redis_url=url, api_keys="a-key-of-my-own-0123456789")


def test_missing_or_default_api_keys_are_refused() -> None:
    with pytest.raises(ValidationError, match="needs VLMQ_API_KEYS"):
        production(redis_url=GOOD_URL)
    with pytest.raises(ValidationError, match="known default key"):
        production(redis_url=GOOD_URL, api_keys="mine-0123456789,changeme")


def test_own_secrets_pass_and_development_needs_none() -> None:
    assert production(redis_url=GOOD_URL, api_keys_file="/run/vlmq-secrets/api-keys").env == "production"
    development = GatewaySettings(_env_file=None, redis_url="redis://127.0.0.1:6379/0")  # type: ignore[call-arg]
    assert development.env == "development" and development.serve_docs


def test_workers_check_the_redis_password_too() -> None:
    with pytest.raises(ValidationError, match="needs a Redis password"):
        InferenceSettings(_env_file=None, env="production", redis_url="redis://redis:6379/0")  # type: ignore[call-arg]
    assert InferenceSettings(_env_file=None, env="production", redis_url=GOOD_URL).env == "production"  # type: ignore[call-arg]
