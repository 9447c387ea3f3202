"""The inference worker's own Lua script (the shared ones live in ``shared/jobs.py``)."""

from __future__ import annotations

from shared.jobs import FENCED_LUA, IS_TERMINAL_LUA

# KEYS: job hash, events stream, wake channel. ARGV[1]: maxlen; ARGV[2]: the attempt (fence);
# ARGV[3..]: triples (first token index, index after the event, token event JSON).
# Refused (returns 0) when the job is gone, terminal or owned by another attempt: the writer then
# cancels the engine request. An event whose index is already published (hash field
# ``published``: tokens in the stream) is skipped, so a re-sent batch never duplicates tokens.
APPEND_TOKENS_LUA = (
    IS_TERMINAL_LUA
    + FENCED_LUA
    + """
local status = redis.call('HGET', KEYS[1], 'status')
if not status or is_terminal(status) or fenced(2) then return 0 end
local published = tonumber(redis.call('HGET', KEYS[1], 'published') or '0')
local id
for i = 3, #ARGV, 3 do
  if tonumber(ARGV[i]) >= published then
    id = redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[1], '*', 'data', ARGV[i + 2])
    published = tonumber(ARGV[i + 1])
  end
end
if id then
  redis.call('HSET', KEYS[1], 'published', published)
  redis.call('PUBLISH', KEYS[3], id)
end
return 1
"""
)

# KEYS: job hash, cancel flag. Returns {} when the job is gone; else {attempt, cancelled, fields}:
# the attempt this delivery begins (HINCRBY), or 0 when the job is already terminal (nothing
# begun), the cancel flag (0/1), and the hash as HGETALL returned it before the increment.
BEGIN_ATTEMPT_LUA = (
    IS_TERMINAL_LUA
    + """
local raw = redis.call('HGETALL', KEYS[1])
if #raw == 0 then return {} end
local attempt = 0
if not is_terminal(redis.call('HGET', KEYS[1], 'status')) then
  attempt = redis.call('HINCRBY', KEYS[1], 'attempt', 1)
end
return {attempt, redis.call('EXISTS', KEYS[2]), raw}
"""
)
