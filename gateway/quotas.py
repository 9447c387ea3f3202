"""Per-tenant quotas, held in Redis so every gateway replica counts the same: requests per
minute, tokens per minute (the tokens a request may generate: its ``max_tokens``) and jobs in
flight. Checked and counted in one script before anything of the request is stored; over a quota:
429 with ``Retry-After`` and OpenAI's ``x-ratelimit-*`` headers (also sent on every accepted
request). Windows are fixed minutes; jobs in flight are the tenant's set of job keys, pruned of
finished ones as it is read.
"""

from __future__ import annotations

import math
import time

import redis.asyncio as aioredis

from gateway.errors import APIError
from gateway.keyring import Tenant
from shared.keys import Keys

# KEYS: requests window, tokens window, the tenant's jobs in flight. ARGV: rpm, tpm, concurrency
# (0: no limit), tokens asked, now, the new job's key. Returns {'ok', requests used, tokens used} or
# {what is over, limit}.
QUOTA_LUA = """
local function terminal(s)
  return s == 'done' or s == 'failed' or s == 'cancelled' or s == 'expired'
end
local rpm, tpm = tonumber(ARGV[1]), tonumber(ARGV[2])
local concurrency, tokens = tonumber(ARGV[3]), tonumber(ARGV[4])
if concurrency > 0 then
  local live = 0
  for _, job in ipairs(redis.call('ZRANGE', KEYS[3], 0, -1)) do
    local status = redis.call('HGET', job, 'status')
    if status and not terminal(status) then live = live + 1 else redis.call('ZREM', KEYS[3], job) end
  end
  if live >= concurrency then return {'concurrency', concurrency} end
end
local used = tonumber(redis.call('GET', KEYS[1]) or '0')
if rpm > 0 and used >= rpm then return {'requests', rpm} end
local spent = tonumber(redis.call('GET', KEYS[2]) or '0')
if tpm > 0 and spent + tokens > tpm then return {'tokens', tpm} end
redis.call('INCR', KEYS[1])
redis.call('EXPIRE', KEYS[1], 61)
redis.call('INCRBY', KEYS[2], tokens)
redis.call('EXPIRE', KEYS[2], 61)
if concurrency > 0 then redis.call('ZADD', KEYS[3], ARGV[5], ARGV[6]) end
return {'ok', used + 1, spent + tokens}
"""


async def charge(
    redis: aioredis.Redis, keys: Keys, tenant: Tenant | None, job_id: str, tokens: int
) -> dict[str, str]:
    """Count the request against the tenant's quotas (429 when over); the rate-limit headers."""
    if tenant is None or not (tenant.rpm or tenant.tpm or tenant.concurrency):
        return {}
    now = time.time()
    minute = int(now // 60)
    reset = f"{60 - now % 60:.0f}s"
    script_keys = [
        keys.tenant_window(tenant.name, "requests", minute),
        keys.tenant_window(tenant.name, "tokens", minute),
        keys.tenant_jobs(tenant.name),
    ]
    args: list[int | float | str] = [
        tenant.rpm,
        tenant.tpm,
        tenant.concurrency,
        tokens,
        now,
        keys.job(job_id),
    ]
    reply = await redis.eval(QUOTA_LUA, 3, *script_keys, *args)  # type: ignore[misc]
    what = reply[0].decode() if isinstance(reply[0], bytes) else str(reply[0])
    if what != "ok":
        raise _over(what, int(reply[1]), now)
    return _headers(tenant, int(reply[1]), int(reply[2]), reset)


def _headers(tenant: Tenant, requests: int, tokens: int, reset: str) -> dict[str, str]:
    headers: dict[str, str] = {}
    if tenant.rpm:
        headers |= {
            "x-ratelimit-limit-requests": str(tenant.rpm),
            "x-ratelimit-remaining-requests": str(max(0, tenant.rpm - requests)),
            "x-ratelimit-reset-requests": reset,
        }
    if tenant.tpm:
        headers |= {
            "x-ratelimit-limit-tokens": str(tenant.tpm),
            "x-ratelimit-remaining-tokens": str(max(0, tenant.tpm - tokens)),
            "x-ratelimit-reset-tokens": reset,
        }
    return headers


def _over(what: str, limit: int, now: float) -> APIError:
    wait = 1 if what == "concurrency" else max(1, math.ceil(60 - now % 60))
    headers = {"Retry-After": str(wait)}
    if what in ("requests", "tokens"):
        headers |= {
            f"x-ratelimit-limit-{what}": str(limit),
            f"x-ratelimit-remaining-{what}": "0",
            f"x-ratelimit-reset-{what}": f"{wait}s",
        }
    messages = {
        "requests": f"rate limit: {limit} requests per minute for this API key",
        "tokens": f"rate limit: {limit} tokens (max_tokens) per minute for this API key",
        "concurrency": f"rate limit: {limit} jobs in flight at once for this API key",
    }
    return APIError(429, f"{messages[what]}; retry in {wait} s", code="rate_limit_exceeded", headers=headers)
