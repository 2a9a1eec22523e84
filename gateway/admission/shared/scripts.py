"""The Lua scripts that keep the shared ledger in Redis consistent: each runs atomically on the Redis server.

Keys of one pool (``keys.py`` builds the names):

    leases   HASH  lease id -> "tokens|sequences|replica|tenant"          one per live reservation
    expiry   ZSET  lease id -> expiry (ms, Redis's own clock)             renewed by the replica that holds it
    totals   HASH  tokens, seqs, a:<tenant> (sequences), t:<tenant> (tokens)   what the live leases add up to
    queue    ZSET  waiter id -> arrival (ms)                              requests waiting, on every replica
    qexp     ZSET  waiter id -> expiry (ms)                               renewed while its replica polls
    qinfo    HASH  waiter id -> "tokens|sequences"                        what each waiter will reserve

The head-of-line rule holds across replicas. A waiter that has waited longer than ``overtake_window_s`` anywhere
keeps what it needs: nobody else's reservation may leave the pool too full for it (the reserve script checks the
oldest waiter's needs), so freed tokens accumulate for it whichever replica frees them, as in one waiting room.

Every script first drops the leases whose expiry has passed (their replica stopped renewing them: it crashed or is
cut off), so a dead replica's reservations are gone within ``lease_ttl_s`` of its last renewal, and every script
answers with the pool's totals (a flat HGETALL) so the caller's view of the other replicas stays fresh. Time is
Redis's (``TIME``), never a replica's clock: replicas with skewed clocks agree on what has expired. Every write
refreshes the keys' own expiry, so the pools of a fleet that is gone disappear from Redis too.
"""

from __future__ import annotations

_COMMON = """
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local function drop(id)
  local v = redis.call('HGET', KEYS[1], id)
  redis.call('ZREM', KEYS[2], id)
  if not v then return 0 end
  local tokens, seqs, tenant = string.match(v, '^(%d+)|(%d+)|[^|]*|(.*)$')
  tokens = tonumber(tokens)
  seqs = tonumber(seqs)
  redis.call('HDEL', KEYS[1], id)
  redis.call('HINCRBY', KEYS[3], 'tokens', -tokens)
  redis.call('HINCRBY', KEYS[3], 'seqs', -seqs)
  local left = redis.call('HINCRBY', KEYS[3], 'a:' .. tenant, -seqs)
  redis.call('HINCRBY', KEYS[3], 't:' .. tenant, -tokens)
  if left <= 0 then redis.call('HDEL', KEYS[3], 'a:' .. tenant, 't:' .. tenant) end
  return 1
end
local function add(id, v, expires)
  local tokens, seqs, tenant = string.match(v, '^(%d+)|(%d+)|[^|]*|(.*)$')
  redis.call('HSET', KEYS[1], id, v)
  redis.call('ZADD', KEYS[2], expires, id)
  redis.call('HINCRBY', KEYS[3], 'tokens', tonumber(tokens))
  redis.call('HINCRBY', KEYS[3], 'seqs', tonumber(seqs))
  redis.call('HINCRBY', KEYS[3], 'a:' .. tenant, tonumber(seqs))
  redis.call('HINCRBY', KEYS[3], 't:' .. tenant, tonumber(tokens))
end
local function purge(now)
  local expired = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now)
  for _, id in ipairs(expired) do drop(id) end
  return #expired
end
local function keep(ttl_ms)
  for i = 1, 3 do redis.call('PEXPIRE', KEYS[i], ttl_ms * 3) end
end
local function field(name)
  return tonumber(redis.call('HGET', KEYS[3], name) or '0')
end
"""

_WAITERS = """
local function purge_waiters(now)
  local gone = redis.call('ZRANGEBYSCORE', KEYS[5], '-inf', now)
  for _, id in ipairs(gone) do
    redis.call('ZREM', KEYS[4], id)
    redis.call('ZREM', KEYS[5], id)
    redis.call('HDEL', KEYS[6], id)
  end
end
"""

RESERVE = _COMMON + _WAITERS + """
-- KEYS: leases, expiry, totals, queue, qexp, qinfo
-- ARGV: id, value, tokens, seqs, tenant, ttl_ms, slots, pool_tokens (-1: split pool), tenant_cap (-1), share (-1),
--       waiter id ('': admitted without waiting), overtake_ms
local now = now_ms()
local expired = purge(now)
purge_waiters(now)
local tokens, seqs, tenant = tonumber(ARGV[3]), tonumber(ARGV[4]), ARGV[5]
local ttl, slots, pool, cap, share = tonumber(ARGV[6]), tonumber(ARGV[7]), tonumber(ARGV[8]), tonumber(ARGV[9]),
  tonumber(ARGV[10])
local verdict = 'ok'
local head = redis.call('ZRANGE', KEYS[4], 0, 0, 'WITHSCORES')
if head[1] and head[1] ~= ARGV[11] and now - tonumber(head[2]) >= tonumber(ARGV[12]) then
  -- the oldest waiter has waited past the overtake window: keep what it needs
  local needs = redis.call('HGET', KEYS[6], head[1]) or '0|0'
  local head_tokens, head_seqs = string.match(needs, '^(%d+)|(%d+)$')
  head_tokens, head_seqs = tonumber(head_tokens), tonumber(head_seqs)
  if field('seqs') + seqs + head_seqs > slots or (pool >= 0 and field('tokens') + tokens + head_tokens > pool) then
    verdict = 'behind'
  end
end
if verdict ~= 'ok' then
elseif cap >= 0 and field('a:' .. tenant) + seqs > cap then verdict = 'tenant_active'  -- the planner's order
elseif share >= 0 and field('t:' .. tenant) + tokens > share then verdict = 'tenant_share'
elseif field('seqs') + seqs > slots then verdict = 'slots'
elseif pool >= 0 and field('tokens') + tokens > pool then verdict = 'tokens'
end
if verdict == 'ok' and redis.call('HEXISTS', KEYS[1], ARGV[1]) == 0 then
  add(ARGV[1], ARGV[2], now + ttl)
  keep(ttl)
end
return {verdict, expired, redis.call('HGETALL', KEYS[3])}
"""

RELEASE = _COMMON + """
-- ARGV: id
local expired = purge(now_ms())
local dropped = drop(ARGV[1])
return {dropped, expired, redis.call('HGETALL', KEYS[3])}
"""

RENEW = _COMMON + """
-- ARGV: ttl_ms, then id, value pairs: every live lease of this replica in this pool. A lease that expired (this
-- replica was cut off for longer than the ttl) is added back: it is still running on the backend.
local now = now_ms()
local ttl = tonumber(ARGV[1])
local expired = purge(now)
local readded = 0
for i = 2, #ARGV, 2 do
  if redis.call('HEXISTS', KEYS[1], ARGV[i]) == 1 then
    redis.call('ZADD', KEYS[2], now + ttl, ARGV[i])
  else
    add(ARGV[i], ARGV[i + 1], now + ttl)
    readded = readded + 1
  end
end
keep(ttl)
return {readded, expired, redis.call('HGETALL', KEYS[3])}
"""

TOTALS = _COMMON + """
local expired = purge(now_ms())
return {0, expired, redis.call('HGETALL', KEYS[3])}
"""

QUEUE_JOIN = _WAITERS + """
-- KEYS: -, -, -, queue, qexp, qinfo (the pool's keys). ARGV: id, ttl_ms, max_queue, tokens, seqs.
-- Requests waiting for this pool on every replica, at most max_queue; arrival on Redis's clock.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
purge_waiters(now)
local waiting = redis.call('ZCARD', KEYS[4])
local known = redis.call('ZSCORE', KEYS[4], ARGV[1])
if known then waiting = waiting - 1 end
if waiting >= tonumber(ARGV[3]) then return {0, waiting} end
if not known then redis.call('ZADD', KEYS[4], now, ARGV[1]) end
redis.call('ZADD', KEYS[5], now + tonumber(ARGV[2]), ARGV[1])
redis.call('HSET', KEYS[6], ARGV[1], ARGV[4] .. '|' .. ARGV[5])
for i = 4, 6 do redis.call('PEXPIRE', KEYS[i], tonumber(ARGV[2]) * 3) end
return {1, waiting + 1}
"""

QUEUE_TOUCH = """
-- KEYS: -, -, -, queue, qexp, qinfo. ARGV: ttl_ms, then this replica's waiters in the pool: still waiting.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
for i = 2, #ARGV do redis.call('ZADD', KEYS[5], 'XX', now + tonumber(ARGV[1]), ARGV[i]) end
for i = 4, 6 do redis.call('PEXPIRE', KEYS[i], tonumber(ARGV[1]) * 3) end
return 1
"""

QUEUE_LEAVE = """
-- KEYS: -, -, -, queue, qexp, qinfo. ARGV: id.
redis.call('ZREM', KEYS[4], ARGV[1])
redis.call('ZREM', KEYS[5], ARGV[1])
redis.call('HDEL', KEYS[6], ARGV[1])
return 1
"""

RATE_TAKE = """
-- KEYS: requests bucket, tokens bucket (HASH level, updated_ms, capacity). ARGV: requests per minute (-1: none),
-- tokens per minute (-1: none), prompt tokens. Takes one request and the prompt's tokens, or neither; answers
-- {1, 0, ''} or {0, wait_ms (-1: never), which}. Buckets refill continuously: capacity per 60,000 ms.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local function level(key, capacity)
  local v = redis.call('HMGET', key, 'level', 'updated', 'capacity')
  local lvl, updated, cap = tonumber(v[1]), tonumber(v[2]), tonumber(v[3])
  if lvl == nil then return capacity end
  if cap ~= capacity then lvl = capacity - (cap - lvl) end  -- a changed rate keeps what was used
  return math.min(capacity, lvl + math.max(0, now - updated) * capacity / 60000)
end
local wants = {{KEYS[1], tonumber(ARGV[1]), 1, 'requests'}, {KEYS[2], tonumber(ARGV[2]), tonumber(ARGV[3]), 'tokens'}}
local levels = {}
local worst, which = 0, ''
for i, w in ipairs(wants) do
  if w[2] >= 0 then
    levels[i] = level(w[1], w[2])
    local wait
    if w[3] > w[2] then wait = -1
    elseif levels[i] >= w[3] then wait = 0
    else wait = math.ceil((w[3] - levels[i]) * 60000 / w[2]) end
    if wait == -1 then return {0, -1, w[4]} end
    if wait > worst then worst, which = wait, w[4] end
  end
end
if worst > 0 then return {0, worst, which} end
for i, w in ipairs(wants) do
  if w[2] >= 0 then
    redis.call('HSET', w[1], 'level', tostring(levels[i] - w[3]), 'updated', now, 'capacity', w[2])
    redis.call('PEXPIRE', w[1], 120000)
  end
end
return {1, 0, ''}
"""

RATE_SETTLE = """
-- KEYS: tokens bucket. ARGV: tokens per minute, output tokens: charged after the answer (may go below zero).
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local capacity = tonumber(ARGV[1])
local v = redis.call('HMGET', KEYS[1], 'level', 'updated', 'capacity')
local lvl, updated, cap = tonumber(v[1]), tonumber(v[2]), tonumber(v[3])
if lvl == nil then lvl, updated, cap = capacity, now, capacity end
if cap ~= capacity then lvl = capacity - (cap - lvl) end
lvl = math.min(capacity, lvl + math.max(0, now - updated) * capacity / 60000) - tonumber(ARGV[2])
redis.call('HSET', KEYS[1], 'level', tostring(lvl), 'updated', now, 'capacity', capacity)
redis.call('PEXPIRE', KEYS[1], 120000)
return 1
"""
