"""Every Lua script that changes a job's status or attempt (and the decode worker's tensor fetch).

Scripts run on sync and asyncio clients alike (``client.register_script(SRC)``, or
``writes.pipe_script`` inside a pipeline). Fencing: worker-side calls pass their attempt number;
a script refuses when the hash's ``attempt`` differs (a newer attempt owns the job). Gateway calls
pass no fence.
"""

from __future__ import annotations

from shared.keys import INTERACTIVE_SUFFIX, PIXELS_SUFFIX
from shared.schemas import SCHEMA_VERSION

ENTRY_V = str(SCHEMA_VERSION)  # every inference stream entry says which schema wrote it

# Lua: true when a status string is terminal (every script below uses it).
IS_TERMINAL_LUA = """
local function is_terminal(s)
  return s == 'done' or s == 'failed' or s == 'cancelled' or s == 'expired'
end
"""

# Lua: true when ARGV[n] is a fence (attempt number) that is not the job's current attempt.
FENCED_LUA = """
local function fenced(n)
  return ARGV[n] ~= nil and ARGV[n] ~= '' and redis.call('HGET', KEYS[1], 'attempt') ~= ARGV[n]
end
"""

# KEYS (every job script, ``writes.job_keys``): job hash, events stream, wake channel, active-jobs set
# (member: the job hash key, score: the time of its last progress).
# ARGV: new status, event fields JSON, now, ttl, maxlen, fence. Refuses (returns 0) when the job is
# gone, terminal or fenced; else sets status, appends event, marks progress.
SET_STATUS_LUA = (
    IS_TERMINAL_LUA
    + FENCED_LUA
    + """
local status = redis.call('HGET', KEYS[1], 'status')
if not status or is_terminal(status) or fenced(6) then return 0 end
redis.call('HSET', KEYS[1], 'status', ARGV[1], 'updated_at', ARGV[3])
redis.call('ZADD', KEYS[4], ARGV[3], KEYS[1])
local id = redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[5], '*', 'data', ARGV[2])
redis.call('EXPIRE', KEYS[2], ARGV[4])
redis.call('PUBLISH', KEYS[3], id)
return 1
"""
)

# Same refusal rule; ARGV[6] is a flat JSON object of extra hash fields (text, usage, ...), ARGV[7]
# the fence. Returns 1 when written, 2 when this same attempt already wrote it (a re-sent FINISH
# after a lost reply: idempotent), 0 when gone or already terminal, -1 when another attempt owns it.
# A terminal job needs its pixels no more: they go (``Keys.job_pixels``, derived from KEYS[1] so
# that every caller's KEYS stay the four job keys).
FINISH_LUA = (
    IS_TERMINAL_LUA
    + FENCED_LUA
    + """
local status = redis.call('HGET', KEYS[1], 'status')
if not status then return 0 end
if fenced(7) then return -1 end
if is_terminal(status) then
  if ARGV[7] ~= '' and redis.call('HGET', KEYS[1], 'finished_attempt') == ARGV[7] then return 2 end
  return 0
end
redis.call('HSET', KEYS[1], 'status', ARGV[1], 'updated_at', ARGV[3])
redis.call('ZREM', KEYS[4], KEYS[1])
redis.call('ZREM', KEYS[4] .. '"""
    + INTERACTIVE_SUFFIX
    + """', KEYS[1])
if ARGV[7] ~= '' then redis.call('HSET', KEYS[1], 'finished_attempt', ARGV[7]) end
local extra = cjson.decode(ARGV[6])
for k, v in pairs(extra) do redis.call('HSET', KEYS[1], k, v) end
redis.call('DEL', KEYS[1] .. '"""
    + PIXELS_SUFFIX
    + """')
local id = redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[5], '*', 'data', ARGV[2])
redis.call('EXPIRE', KEYS[1], ARGV[4])
redis.call('EXPIRE', KEYS[2], ARGV[4])
redis.call('PUBLISH', KEYS[3], id)
return 1
"""
)

# KEYS: the four job keys, then the stream it goes to (the shared one, or a worker's own), then
# (a job with an image) its pixels key. ARGV: as SET_STATUS_LUA (6 values), then job_id, then the
# pixels and their TTL. Only from queued/decoding: a redelivered task whose job is already handed
# over (or a job cancelled meanwhile) writes nothing, pixels included. The stream entry is kept in
# the hash (``entry_id``, ``entry_stream``) so the sweeper can tell a lost entry from a slow one.
HANDOFF_LUA = (
    """
local status = redis.call('HGET', KEYS[1], 'status')
if status ~= 'queued' and status ~= 'decoding' then return 0 end
if KEYS[6] then redis.call('SET', KEYS[6], ARGV[8], 'EX', ARGV[9]) end
local entry = redis.call('XADD', KEYS[5], '*', 'job_id', ARGV[7], 'v', '"""
    + ENTRY_V
    + """')
redis.call('HSET', KEYS[1], 'status', ARGV[1], 'updated_at', ARGV[3], 'waiting_at', ARGV[3])
redis.call('HSET', KEYS[1], 'entry_id', entry, 'entry_stream', KEYS[5])
redis.call('ZADD', KEYS[4], ARGV[3], KEYS[1])
local id = redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[5], '*', 'data', ARGV[2])
redis.call('EXPIRE', KEYS[2], ARGV[4])
redis.call('PUBLISH', KEYS[3], id)
return 1
"""
)

# KEYS: the active-jobs set, its interactive part. ARGV: cap, now, the job hash key, and for an
# interactive job when it stops holding batch work ('' for batch work, or no hold). Admission and
# its reservation in one step, so concurrent gateways never admit past the cap: returns -1 when
# admitted (the job is in the set from now on), else the depth that refused it. Interactive entries
# past their hold leave here (a job that never finishes holds batch work no longer than that).
ADMIT_LUA = """
local depth = redis.call('ZCARD', KEYS[1])
if depth >= tonumber(ARGV[1]) then return depth end
redis.call('ZADD', KEYS[1], ARGV[2], ARGV[3])
if ARGV[4] ~= '' then
  redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', ARGV[2])
  redis.call('ZADD', KEYS[2], ARGV[4], ARGV[3])
end
return -1
"""

# KEYS: job hash, active-jobs set, decode queue list. ARGV: now, cutoff, max decode attempts, task
# message. A job still queued/decoding with no progress since ``cutoff`` gets its decode task again
# (decoding is idempotent; a redelivered duplicate finds the job handed over and does nothing).
# Returns 1 re-enqueued, 0 moved on meanwhile, -1 out of attempts (the caller fails it).
REDECODE_LUA = """
local status = redis.call('HGET', KEYS[1], 'status')
if status ~= 'queued' and status ~= 'decoding' then return 0 end
local score = redis.call('ZSCORE', KEYS[2], KEYS[1])
if score and tonumber(score) > tonumber(ARGV[2]) then return 0 end
if redis.call('HINCRBY', KEYS[1], 'decode_enqueues', 1) > tonumber(ARGV[3]) then return -1 end
redis.call('LPUSH', KEYS[3], ARGV[4])
redis.call('ZADD', KEYS[2], ARGV[1], KEYS[1])
return 1
"""

# KEYS: job hash, active-jobs set, shared inference stream. ARGV: now, cutoff, job_id. A job
# waiting or generating with no progress since ``cutoff``: if its stream entry is gone (the stream
# was deleted, flushed or evicted) it gets a new one in the shared stream; if the entry is there it
# is only slow (a dead consumer's entry is claimed by XAUTOCLAIM). Returns 2 re-added, 1 entry
# alive, 0 moved on meanwhile. (The entry's stream is read from the hash: vlmq runs on one Redis
# node or Sentinel, never Cluster, so undeclared keys are safe.)
REQUEUE_INFERENCE_LUA = (
    """
local status = redis.call('HGET', KEYS[1], 'status')
if status ~= 'waiting' and status ~= 'generating' then return 0 end
local score = redis.call('ZSCORE', KEYS[2], KEYS[1])
if score and tonumber(score) > tonumber(ARGV[2]) then return 0 end
redis.call('ZADD', KEYS[2], ARGV[1], KEYS[1])
local entry = redis.call('HGET', KEYS[1], 'entry_id')
local stream = redis.call('HGET', KEYS[1], 'entry_stream') or KEYS[3]
if entry and #redis.call('XRANGE', stream, entry, entry) > 0 then return 1 end
local id = redis.call('XADD', KEYS[3], '*', 'job_id', ARGV[3], 'v', '"""
    + ENTRY_V
    + """')
redis.call('HSET', KEYS[1], 'entry_id', id, 'entry_stream', KEYS[3])
return 2
"""
)

# KEYS: the session-owner key, the image-owner key, the workers' registry. ARGV: the oldest
# heartbeat that still counts as alive. The worker a job should go to: the live owner of its
# session KV, else of its image's features; false: any worker (the shared stream).
ROUTE_LUA = """
for i = 1, 2 do
  local owner = redis.call('GET', KEYS[i])
  if owner then
    local beat = redis.call('ZSCORE', KEYS[3], owner)
    if beat and tonumber(beat) >= tonumber(ARGV[1]) then return owner end
  end
end
return false
"""

# KEYS: a worker's own stream, the shared stream. ARGV: group, cutoff entry id ('+': all), max
# entries, the job key prefix ('<prefix>:job:'). Entries the worker has not read yet (after its
# group's last-delivered id) and older than the cutoff move to the shared stream, so a job routed
# to a busy or dead worker waits at most the affinity bound. Returns how many moved.
MOVE_UNREAD_LUA = (
    """
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
local last = '0-0'
for _, g in ipairs(redis.call('XINFO', 'GROUPS', KEYS[1])) do
  local name, delivered
  for i = 1, #g, 2 do
    if g[i] == 'name' then name = g[i + 1] elseif g[i] == 'last-delivered-id' then delivered = g[i + 1] end
  end
  if name == ARGV[1] then last = delivered end
end
local entries = redis.call('XRANGE', KEYS[1], '(' .. last, ARGV[2], 'COUNT', ARGV[3])
for _, e in ipairs(entries) do
  local job_id = ''
  for i = 1, #e[2], 2 do if e[2][i] == 'job_id' then job_id = e[2][i + 1] end end
  local id = redis.call('XADD', KEYS[2], '*', 'job_id', job_id, 'v', '"""
    + ENTRY_V
    + """')
  redis.call('XDEL', KEYS[1], e[1])
  local job = ARGV[4] .. job_id
  if redis.call('HGET', job, 'entry_id') == e[1] then
    redis.call('HSET', job, 'entry_id', id, 'entry_stream', KEYS[2])
  end
end
return #entries
"""
)

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

# KEYS: job hash, cancel flag, and (optional) the job's pixels. Returns {} when the job is gone;
# else {attempt, cancelled, fields, pixels}: the attempt this delivery begins (HINCRBY), or 0 when
# the job is already terminal (nothing begun), the cancel flag (0/1), the hash as HGETALL returned
# it before the increment, and the pixels (nil: none, or not asked for, or terminal).
BEGIN_ATTEMPT_LUA = (
    IS_TERMINAL_LUA
    + """
local raw = redis.call('HGETALL', KEYS[1])
if #raw == 0 then return {} end
local attempt = 0
if not is_terminal(redis.call('HGET', KEYS[1], 'status')) then
  attempt = redis.call('HINCRBY', KEYS[1], 'attempt', 1)
end
local pixels = false
if KEYS[3] and attempt ~= 0 then pixels = redis.call('GET', KEYS[3]) end
return {attempt, redis.call('EXISTS', KEYS[2]), raw, pixels}
"""
)

# KEYS: the workers' registry, the session-owner key, then the key naming who holds each of the
# job's images decoded (``Keys.image_input_owner``). ARGV: the oldest heartbeat that still counts as
# alive, the heartbeat keys' prefix (``Keys.worker_heartbeat('')``), '1' for a follow-up (its last
# turn shows no image). For a job the gateway may hand over without pixels
# (``shared.jobs.routing.may_skip_decoding``): the one live worker that holds every image, provided
# every live worker keeps decoded images (heartbeat field ``image_inputs``: a worker of a release
# without them fails such a job, and any worker may get it: an entry moved off a busy worker's
# stream, claimed from a dead one, re-added by the sweeper), and, for a follow-up, that its session
# KV is not on another live worker (decoded, it is then routed there). False: a decode task. The
# heartbeats are read last: a new picture (no record) costs one GET.
ROUTE_HOLDER_LUA = """
local function alive(w)
  local beat = redis.call('ZSCORE', KEYS[1], w)
  return beat and tonumber(beat) >= tonumber(ARGV[1])
end
local holder = false
for i = 3, #KEYS do
  local owner = redis.call('GET', KEYS[i])
  if not owner or (holder and owner ~= holder) then return false end
  holder = owner
end
if not holder or not alive(holder) then return false end
if ARGV[3] == '1' then
  local session = redis.call('GET', KEYS[2])
  if session and session ~= holder and alive(session) then return false end
end
for _, w in ipairs(redis.call('ZRANGEBYSCORE', KEYS[1], ARGV[1], '+inf')) do
  local stats = redis.call('GET', ARGV[2] .. w)
  if not stats or not string.find(stats, '"image_inputs"', 1, true) then return false end
end
return holder
"""

# KEYS: an owner record. ARGV: a worker id. Deletes the record only if it names that worker (another
# may have written it since). Returns 1 when deleted.
DEL_IF_OWNER_LUA = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""

# KEYS: job hash, active-jobs set, decode queue list, the stream of the job's entry. ARGV: now, the
# attempt (fence), the decode task's message, the consumer group, the entry id. A job the gateway
# handed to inference without decoding (hash field ``decode_skipped``) whose worker does not hold
# its images: back to ``queued`` with its decode task, the flag cleared (the decode worker's pixels
# are then used: it never comes back twice), ``returned`` counted (a delivery that ran nothing:
# not one of ``max_deliveries``), and its entry acknowledged and deleted. From ``waiting``, or
# ``generating`` (a worker that died mid-answer: the next attempt skips the published tokens, as
# any retry does). Returns 1 returned; 0 nothing to return (gone, terminal, already queued), the
# entry acknowledged; -1 fenced (another attempt owns the job and its entry): nothing written.
RETURN_TO_DECODING_LUA = """
local status = redis.call('HGET', KEYS[1], 'status')
if status and redis.call('HGET', KEYS[1], 'attempt') ~= ARGV[2] then return -1 end
redis.call('XACK', KEYS[4], ARGV[4], ARGV[5])
redis.call('XDEL', KEYS[4], ARGV[5])
if status ~= 'waiting' and status ~= 'generating' then return 0 end
redis.call('HINCRBY', KEYS[1], 'returned', 1)
redis.call('HSET', KEYS[1], 'status', 'queued', 'updated_at', ARGV[1])
redis.call('HDEL', KEYS[1], 'decode_skipped', 'entry_id', 'entry_stream')
redis.call('ZADD', KEYS[2], ARGV[1], KEYS[1])
redis.call('LPUSH', KEYS[3], ARGV[3])
return 1
"""
