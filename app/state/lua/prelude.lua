-- Prepended to every script: the Redis clock (`now`), number formatting, the check
-- layout in KEYS, token buckets, concurrency-zset expiry, budget purges, keys' last use
-- and ledger appends. Every key a script touches comes from KEYS (Redis Cluster routes
-- and checks by KEYS).
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1e6
local function num(x) return string.format('%.17g', x) end
local function int(x) return string.format('%.0f', math.ceil(x)) end
-- Give each check of q (rates, conc, budgets) its keys, which follow KEYS[n] in the order
-- of RedisStore._layout: the rate buckets, the concurrency zsets, then per budget its
-- counter, `:held` and `:amt`. `at` is the position of a check's first key (the
-- refusing scope is reported as that position).
local function checks(q, n)
  for _, r in ipairs(q.rates) do n = n + 1; r.k, r.at = KEYS[n], n end
  for _, c in ipairs(q.conc) do n = n + 1; c.k, c.at = KEYS[n], n end
  for _, b in ipairs(q.budgets) do
    b.k, b.held, b.amt, b.at = KEYS[n + 1], KEYS[n + 2], KEYS[n + 3], n + 1
    n = n + 3
  end
end
local function bucket(k, cap)
  local s = redis.call('HMGET', k, 'tokens', 'ts')
  if not s[1] then return cap end
  return math.min(cap, tonumber(s[1]) + math.max(0, now - tonumber(s[2])) * cap / 60)
end
local function save_bucket(k, cap, tokens)
  redis.call('HSET', k, 'tokens', num(tokens), 'ts', num(now))
  redis.call('PEXPIRE', k, int(((cap - tokens) * 60 / cap + 120) * 1000))
end
local function touch(z)
  local top = redis.call('ZRANGE', z, -1, -1, 'WITHSCORES')
  if top[2] then redis.call('PEXPIREAT', z, int((tonumber(top[2]) + 60) * 1000)) end
end
-- b = {k, held, amt}: purge expired reservations; returns used, reserved.
local function budget(b)
  local gone = redis.call('ZRANGEBYSCORE', b.held, '-inf', num(now))
  for i = 1, #gone, 100 do
    redis.call('HDEL', b.amt, unpack(gone, i, math.min(i + 99, #gone)))
  end
  redis.call('ZREMRANGEBYSCORE', b.held, '-inf', num(now))
  local held = 0
  for _, v in ipairs(redis.call('HVALS', b.amt)) do held = held + tonumber(v) end
  return tonumber(redis.call('HGET', b.k, 'used') or '0'), held
end
local function expire_budget(b)
  for _, k in ipairs({b.k, b.held, b.amt}) do
    redis.call('PEXPIREAT', k, int(b.exp * 1000))
  end
end
-- Raise a key's last use (hash h: key id -> epoch seconds) to `ended`.
local function key_used(h, key_id, ended)
  if key_id == '' then return end
  local last = redis.call('HGET', h, key_id)
  if not last or tonumber(last) < ended then redis.call('HSET', h, key_id, num(ended)) end
end
-- Append a LedgerRecord JSON to a tenant's ledger stream unless its request id `rid` is
-- in the id index `ids` already (the first record stays); returns 1 when written. A
-- record with a session id also adds its entry id to that session's comma-separated
-- list in the tenant's session index `sessions` (hash session id -> entry ids).
-- The entry id is the Redis clock in microseconds, <ms>-<µs within the ms × 1000>, raised
-- past the stream's last id when the clock did not move on, so that the streams of
-- different tenants merge in time order (RedisStore.query_ledger).
local function append_ledger(ids, stream, rid, record, sessions)
  if redis.call('HEXISTS', ids, rid) == 1 then return 0 end
  local ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  local seq = (tonumber(t[2]) % 1000) * 1000
  local last = redis.call('XREVRANGE', stream, '+', '-', 'COUNT', 1)[1]
  if last then
    local lms, lseq = string.match(last[1], '^(%d+)-(%d+)$')
    lms, lseq = tonumber(lms), tonumber(lseq)
    if ms < lms or (ms == lms and seq <= lseq) then ms, seq = lms, lseq + 1 end
  end
  local id = redis.call('XADD', stream, string.format('%.0f-%.0f', ms, seq), 'record', record)
  redis.call('HSET', ids, rid, id)
  local sid = cjson.decode(record).session_id
  if type(sid) == 'string' then
    local had = redis.call('HGET', sessions, sid)
    redis.call('HSET', sessions, sid, had and (had .. ',' .. id) or id)
  end
  return 1
end
-- Release request `id`'s hold on budget `b` and bill what it used.
local function bill(b, id, tokens, usd)
  redis.call('ZREM', b.held, id)
  redis.call('HDEL', b.amt, id)
  if b.unit == 'tokens' then redis.call('HINCRBY', b.k, 'used', int(tokens))
  else redis.call('HINCRBYFLOAT', b.k, 'used', num(usd)) end
  expire_budget(b)
end
