"""The Lua scripts that keep the shared ledger in Redis consistent: each runs atomically on the Redis server.

Keys of one pool (``store._names`` builds them; every script gets all eight):

    leases   HASH  lease id -> "tokens|sequences|replica|tenant"          one per live reservation
    expiry   ZSET  lease id -> expiry (ms, Redis's own clock)             renewed by the replica that holds it
    totals   HASH  tokens, seqs, a:<tenant> (sequences), t:<tenant> (tokens)   what the live leases add up to
    queue    ZSET  waiter id -> arrival (ms)                              requests waiting, on every replica
    qexp     ZSET  waiter id -> expiry (ms)                               renewed while its replica polls
    qinfo    HASH  waiter id -> its place: what it will reserve, its priority, its fair tag, its tenant's caps
    fair     HASH  v (the pool's virtual time), f:<tenant> (its finish tag)   weighted fair queueing, one per pool
    epoch    HASH  id (when this Redis's data began), grace (ms)         one per prefix, never expires: a restart shows

One fair order across replicas. The pool's virtual time and its tenants' finish tags live in Redis, so a request is
tagged the same way whichever replica it reaches (``fair_share``: ``start = max(v, f[tenant])``, then ``f[tenant]``
moves by ``tokens / weight``), and the reserve script admits a request only where the waiting room of a single
kvgate would: it walks the waiters before it in the fair order (priority, then start tag, then arrival), each taking
its room where it fits (a waiter held back by its own tenant's cap takes none), and stops at one that does not fit
once it has waited past ``overtake_window_s`` (the head-of-line rule: freed tokens accumulate for it). The request is
admitted only if what is left holds it; otherwise the answer is ``behind`` and it waits its turn. A request that did
not queue is placed where it would be tagged now; a waiter leaving unserved gives its tag back when it is still its
tenant's last.

Every script first drops the leases whose expiry has passed (their replica stopped renewing them: it crashed or is
cut off), so a dead replica's reservations are gone within ``lease_ttl_s`` of its last renewal, and every script
answers with the pool's totals (a flat HGETALL) so the caller's view of the other replicas stays fresh. Time is
Redis's (``TIME``), never a replica's clock: replicas with skewed clocks agree on what has expired. Every write
refreshes the keys' own expiry, so the pools of a fleet that is gone disappear from Redis too. A change of a pool
while requests wait for it (a lease added, released or expired), and every change of its queue (a waiter come, served
or gone), is published on the ledger's channel as JSON ``[pool name, waiting, flat totals, replica]``: the replicas
with requests waiting for that pool try again at once instead of at their next poll, and every replica knows whether
anyone waits. While nobody waits nothing is published: every replica would decode every other replica's every
change (the cost grew with the square of the replicas), and a replica's own calls bring it the totals anyway.
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
  for _, i in ipairs({1, 2, 3, 7}) do redis.call('PEXPIRE', KEYS[i], ttl_ms * 3) end
end
local function epoch(now, seen, ttl)
  -- this Redis's epoch, made by the first script to find none (a new Redis, or one restarted empty). A replica that
  -- saw another epoch before ('seen') tells it that every lease was lost: until lease_ttl_s after the epoch began,
  -- the replicas still running requests add their leases back (capacity-checked) or fence them, and no new lease
  -- is added (``grace``)
  local id = redis.call('HGET', KEYS[8], 'id')
  if not id then
    id = tostring(now)
    redis.call('HSET', KEYS[8], 'id', id, 'grace', 0)
  end
  local grace = tonumber(redis.call('HGET', KEYS[8], 'grace') or '0')
  if seen ~= '' and seen ~= id and grace < tonumber(id) + ttl then
    grace = tonumber(id) + ttl
    redis.call('HSET', KEYS[8], 'grace', grace)
  end
  return id, grace
end
local function field(name)
  return tonumber(redis.call('HGET', KEYS[3], name) or '0')
end
local function announce(channel, pool, replica, queue_changed)
  -- the pool changed while requests wait for it (or its queue itself changed): tell every replica its totals and
  -- how many wait (those with requests waiting try again at once; a replica that hears of waiters sends its
  -- releases at once). Nobody waiting: nothing is published (every script's answer brings the totals anyway)
  if channel ~= '' and (queue_changed or redis.call('ZCARD', KEYS[4]) > 0) then
    redis.call('PUBLISH', channel,
      cjson.encode({pool, redis.call('ZCARD', KEYS[4]), redis.call('HGETALL', KEYS[3]), replica}))
  end
end
"""

_WAITERS = """
local function fair_get(name)
  return tonumber(redis.call('HGET', KEYS[7], name) or '0')
end
local function fair_set(name, value)
  redis.call('HSET', KEYS[7], name, string.format('%.17g', value))
end
local function parse_place(v)
  -- tokens|seqs|priority|start|finish|tenant_cap|tenant_share|tenant
  local tokens, seqs, prio, start, finish, cap, share, tenant =
    string.match(v, '^(%d+)|(%d+)|(-?%d+)|([^|]+)|([^|]+)|(-?%d+)|(-?%d+)|(.*)$')
  return {tokens = tonumber(tokens), seqs = tonumber(seqs), prio = tonumber(prio), start = tonumber(start),
          finish = tonumber(finish), cap = tonumber(cap), share = tonumber(share), tenant = tenant}
end
local function give_back(place)
  -- a waiter that leaves unserved gives its tag back when it is still its tenant's last
  if fair_get('f:' .. place.tenant) == place.finish then fair_set('f:' .. place.tenant, place.start) end
end
local function forget(id)
  local v = redis.call('HGET', KEYS[6], id)
  redis.call('ZREM', KEYS[4], id)
  redis.call('ZREM', KEYS[5], id)
  redis.call('HDEL', KEYS[6], id)
  return v
end
local function purge_waiters(now)
  local gone = redis.call('ZRANGEBYSCORE', KEYS[5], '-inf', now)
  for _, id in ipairs(gone) do
    local v = forget(id)
    if v then give_back(parse_place(v)) end
  end
  return #gone
end
local function id_parts(id)
  -- "replica:seq": the replica's name, and its own sequence number, compared as a number (as the replica orders
  -- its own queue); a request that did not queue ('\\255') comes after everyone
  local replica, seq = string.match(id, '^(.*):(%d+)$')
  if not replica then return id, 0 end
  return replica, tonumber(seq)
end
local function before(a, b)
  -- the fair order: higher priority first, then the lower start tag, then the earlier arrival, then the replica and
  -- its sequence number; every replica orders its own queue the same way (``waiting_room._Waiter.order``)
  if a.prio ~= b.prio then return a.prio > b.prio end
  if a.start ~= b.start then return a.start < b.start end
  if a.arrival ~= b.arrival then return a.arrival < b.arrival end
  local ar, an = id_parts(a.id)
  local br, bn = id_parts(b.id)
  if ar ~= br then return ar < br end
  return an < bn
end
local function ahead_of(me)
  local arrivals = {}
  local queue = redis.call('ZRANGE', KEYS[4], 0, -1, 'WITHSCORES')
  for i = 1, #queue, 2 do arrivals[queue[i]] = tonumber(queue[i + 1]) end
  local ahead = {}
  local places = redis.call('HGETALL', KEYS[6])
  for i = 1, #places, 2 do
    local id = places[i]
    if id ~= me.id and arrivals[id] then
      local w = parse_place(places[i + 1])
      w.id, w.arrival = id, arrivals[id]
      if before(w, me) then table.insert(ahead, w) end
    end
  end
  table.sort(ahead, before)
  return ahead
end
"""

RESERVE = _COMMON + _WAITERS + """
-- KEYS: leases, expiry, totals, queue, qexp, qinfo, fair, epoch
-- ARGV: 1 id, 2 value, 3 tokens, 4 seqs, 5 tenant, 6 ttl_ms, 7 slots, 8 pool_tokens (-1: split pool),
--       9 tenant_cap (-1), 10 tenant_share (-1), 11 waiter id ('': it did not queue), 12 overtake_ms, 13 weight,
--       14 priority, 15 channel, 16 pool name, 17 replica, 18 '1': add back the lease of a request that still runs
--       (capacity only: no fair turn, no tenant cap, no grace), 19 the epoch this replica saw last ('': none),
--       20.. leases of this replica to release first (``RELEASE``'s, carried by the next reserve: one call)
local now = now_ms()
local expired = purge(now)
local released = 0
for i = 20, #ARGV do released = released + drop(ARGV[i]) end
purge_waiters(now)
local readd = ARGV[18] == '1'
local tokens, seqs, tenant = tonumber(ARGV[3]), tonumber(ARGV[4]), ARGV[5]
local ttl, slots, pool, cap, share = tonumber(ARGV[6]), tonumber(ARGV[7]), tonumber(ARGV[8]), tonumber(ARGV[9]),
  tonumber(ARGV[10])
local epoch_id, grace = epoch(now, ARGV[19], ttl)
local overtake, weight = tonumber(ARGV[12]), tonumber(ARGV[13])
local placed = ARGV[11] ~= '' and redis.call('HGET', KEYS[6], ARGV[11])
local me
if placed then
  me = parse_place(placed)
  me.arrival = tonumber(redis.call('ZSCORE', KEYS[4], ARGV[11]) or now)
  me.id = ARGV[11]
else  -- where it would be tagged now, after everyone already waiting with the same tag
  local start, finish = 0, 0  -- weight 0: arrival order
  if weight > 0 then
    start = math.max(fair_get('v'), fair_get('f:' .. tenant))
    finish = start + math.max(tokens, 1) / weight
  end
  me = {prio = tonumber(ARGV[14]), start = start, finish = finish, arrival = now, id = '\\255'}
end
local function turn()
  -- what the waiters ahead in the fair order take first; see the module docstring
  local room_seqs, room_tokens = slots - field('seqs'), math.huge
  if pool >= 0 then room_tokens = pool - field('tokens') end
  local held_a, held_t = {}, {}
  for _, w in ipairs(ahead_of(me)) do
    local a = field('a:' .. w.tenant) + (held_a[w.tenant] or 0)
    local t = field('t:' .. w.tenant) + (held_t[w.tenant] or 0)
    if (w.cap >= 0 and a + w.seqs > w.cap) or (w.share >= 0 and t + w.tokens > w.share) then
      -- held back by its own tenant's cap: that cap is about fairness, not capacity; it keeps no room
    elseif w.seqs <= room_seqs and w.tokens <= room_tokens then
      room_seqs, room_tokens = room_seqs - w.seqs, room_tokens - w.tokens
      held_a[w.tenant] = (held_a[w.tenant] or 0) + w.seqs
      held_t[w.tenant] = (held_t[w.tenant] or 0) + w.tokens
    elseif now - w.arrival >= overtake then
      return 'behind'  -- it has waited past the overtake window: every freed token is kept for it
    end
  end
  if seqs > room_seqs or (pool >= 0 and tokens > room_tokens) then return 'behind' end
  if cap >= 0 and field('a:' .. tenant) + (held_a[tenant] or 0) + seqs > cap then return 'behind' end
  if share >= 0 and field('t:' .. tenant) + (held_t[tenant] or 0) + tokens > share then return 'behind' end
  return 'ok'
end
local verdict
if not readd and cap >= 0 and field('a:' .. tenant) + seqs > cap then verdict = 'tenant_active'  -- planner's order
elseif not readd and share >= 0 and field('t:' .. tenant) + tokens > share then verdict = 'tenant_share'
elseif field('seqs') + seqs > slots then verdict = 'slots'
elseif pool >= 0 and field('tokens') + tokens > pool then verdict = 'tokens'
elseif readd then verdict = 'ok'
elseif now < grace then verdict = 'behind'  -- Redis lost its leases: those still running come back first
else verdict = turn()
end
if verdict == 'ok' and redis.call('HEXISTS', KEYS[1], ARGV[1]) == 0 then
  add(ARGV[1], ARGV[2], now + ttl)
  if not readd then
    fair_set('v', math.max(fair_get('v'), me.start))  -- serving a request moves virtual time to its start
    if placed then forget(ARGV[11]) elseif weight > 0 then fair_set('f:' .. tenant, me.finish) end
  end
  keep(ttl)
  announce(ARGV[15], ARGV[16], ARGV[17], placed)  -- a waiter served: its place left the queue
elseif expired + released > 0 then
  announce(ARGV[15], ARGV[16], ARGV[17], false)
end
return {verdict, expired, redis.call('HGETALL', KEYS[3]), epoch_id}
"""

RELEASE = _COMMON + """
-- ARGV: channel, pool name, replica, then the ids of the leases to drop (one or a batch)
local expired = purge(now_ms())
local dropped = 0
for i = 4, #ARGV do dropped = dropped + drop(ARGV[i]) end
if dropped + expired > 0 then announce(ARGV[1], ARGV[2], ARGV[3], false) end
return {dropped, expired, redis.call('HGETALL', KEYS[3])}
"""

RESIZE = _COMMON + """
-- ARGV: id, tokens (the lease's new size), pool_tokens (-1: no cap), ttl_ms. An elastic reply's growth step
-- (``admission/elastic.py``): the lease holds ``tokens`` from now on, if the pool across replicas has room for the
-- difference. Answers 'ok', 'tokens' (no room: nothing changed) or 'missing' (the lease is gone: expired or lost).
-- Not announced: growth only takes room, and the other replicas read the totals with their next call.
local expired = purge(now_ms())
local v = redis.call('HGET', KEYS[1], ARGV[1])
if not v then return {'missing', expired, redis.call('HGETALL', KEYS[3])} end
local tokens, rest = string.match(v, '^(%d+)(|.*)$')
local tenant = string.match(v, '^%d+|%d+|[^|]*|(.*)$')
local delta = tonumber(ARGV[2]) - tonumber(tokens)
local cap = tonumber(ARGV[3])
if delta > 0 and cap >= 0 and field('tokens') + delta > cap then
  return {'tokens', expired, redis.call('HGETALL', KEYS[3])}
end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2] .. rest)
redis.call('HINCRBY', KEYS[3], 'tokens', delta)
redis.call('HINCRBY', KEYS[3], 't:' .. tenant, delta)
keep(tonumber(ARGV[4]))
return {'ok', expired, redis.call('HGETALL', KEYS[3])}
"""

RENEW = _COMMON + """
-- ARGV: ttl_ms, channel, pool name, replica, the epoch this replica saw last, then the ids of this replica's live
-- leases in this pool. Only leases that still exist are extended: one that expired (this replica was cut off for
-- longer than the ttl) or that Redis lost (restarted empty) is never added back here, without the capacity check;
-- the answer names them, and the replica adds each back through the reserve script (capacity-checked) or fences
-- its request.
local now = now_ms()
local ttl = tonumber(ARGV[1])
local expired = purge(now)
local epoch_id = epoch(now, ARGV[5], ttl)
local missing = {}
for i = 6, #ARGV do
  if redis.call('HEXISTS', KEYS[1], ARGV[i]) == 1 then
    redis.call('ZADD', KEYS[2], now + ttl, ARGV[i])
  else
    table.insert(missing, ARGV[i])
  end
end
keep(ttl)
if expired > 0 then announce(ARGV[2], ARGV[3], ARGV[4], false) end
return {missing, expired, redis.call('HGETALL', KEYS[3]), epoch_id}
"""

TOTALS = _COMMON + """
-- ARGV: channel, pool name, replica
local expired = purge(now_ms())
if expired > 0 then announce(ARGV[1], ARGV[2], ARGV[3], false) end
return {0, expired, redis.call('HGETALL', KEYS[3])}
"""

QUEUE_JOIN = _COMMON + _WAITERS + """
-- KEYS: the pool's seven. ARGV: 1 id, 2 ttl_ms, 3 max_queue, 4 tokens, 5 seqs, 6 priority, 7 tenant_cap (-1),
-- 8 tenant_share (-1), 9 weight (0: the pool is served in arrival order, no tags), 10 tenant, 11 channel, 12 pool
-- name, 13 replica. Requests waiting for
-- this pool on every replica, at most max_queue; arrival on Redis's clock. Answers {1, waiting, start, finish} (the
-- fair tag, as text, and its arrival in ms) or {0, waiting, '', ''}.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
purge_waiters(now)
local waiting = redis.call('ZCARD', KEYS[4])
local known = redis.call('HGET', KEYS[6], ARGV[1])
if known then waiting = waiting - 1 end
if waiting >= tonumber(ARGV[3]) then return {0, waiting, '', ''} end
local start, finish = 0, 0
if known then  -- a place is taken once: it keeps its arrival and its tag
  local place = parse_place(known)
  start, finish = place.start, place.finish
else
  local tenant, tokens, weight = ARGV[10], tonumber(ARGV[4]), tonumber(ARGV[9])
  if weight > 0 then
    start = math.max(fair_get('v'), fair_get('f:' .. tenant))
    finish = start + math.max(tokens, 1) / weight
    fair_set('f:' .. tenant, finish)
  end
  redis.call('ZADD', KEYS[4], now, ARGV[1])
  redis.call('HSET', KEYS[6], ARGV[1], table.concat({ARGV[4], ARGV[5], ARGV[6], string.format('%.17g', start),
    string.format('%.17g', finish), ARGV[7], ARGV[8], tenant}, '|'))
  announce(ARGV[11], ARGV[12], ARGV[13], true)
end
redis.call('ZADD', KEYS[5], now + tonumber(ARGV[2]), ARGV[1])
for i = 4, 7 do redis.call('PEXPIRE', KEYS[i], tonumber(ARGV[2]) * 3) end
return {1, waiting + 1, string.format('%.17g', start), string.format('%.17g', finish),
  tonumber(redis.call('ZSCORE', KEYS[4], ARGV[1]))}
"""

EPOCH = """
-- KEYS: epoch. This Redis's epoch (made, with no grace, if there is none): read by each replica as it starts, so that
-- after a restart empty every running replica has seen the old one, and the first to call tells Redis that every
-- lease was lost (``epoch`` in the scripts above sets the grace).
local id = redis.call('HGET', KEYS[1], 'id')
if not id then
  local t = redis.call('TIME')
  id = tostring(math.floor(tonumber(t[1]) * 1000 + tonumber(t[2]) / 1000))
  redis.call('HSET', KEYS[1], 'id', id, 'grace', 0)
end
return id
"""

QUEUE_TOUCH = """
-- KEYS: the pool's seven. ARGV: ttl_ms, then this replica's waiters in the pool: still waiting.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
for i = 2, #ARGV do redis.call('ZADD', KEYS[5], 'XX', now + tonumber(ARGV[1]), ARGV[i]) end
for i = 4, 7 do redis.call('PEXPIRE', KEYS[i], tonumber(ARGV[1]) * 3) end
return 1
"""

QUEUE_LEAVE = _COMMON + _WAITERS + """
-- KEYS: the pool's seven. ARGV: id, channel, pool name, replica. A waiter leaves unserved (timeout, disconnect, an
-- error): its tag goes back if it was its tenant's last, and the room it kept is free for the others.
local v = forget(ARGV[1])
if v then
  give_back(parse_place(v))
  announce(ARGV[2], ARGV[3], ARGV[4], true)
end
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
-- KEYS: tokens bucket. ARGV: tokens per minute, output tokens: charged after the answer (may go below zero);
-- negative: the unused part of the output taken up front, given back (never above capacity).
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local capacity = tonumber(ARGV[1])
local v = redis.call('HMGET', KEYS[1], 'level', 'updated', 'capacity')
local lvl, updated, cap = tonumber(v[1]), tonumber(v[2]), tonumber(v[3])
if lvl == nil then lvl, updated, cap = capacity, now, capacity end
if cap ~= capacity then lvl = capacity - (cap - lvl) end
lvl = math.min(capacity, math.min(capacity, lvl + math.max(0, now - updated) * capacity / 60000) - tonumber(ARGV[2]))
redis.call('HSET', KEYS[1], 'level', tostring(lvl), 'updated', now, 'capacity', capacity)
redis.call('PEXPIRE', KEYS[1], 120000)
return 1
"""
