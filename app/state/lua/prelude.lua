-- Prepended to every script: the Redis clock (`now`), number formatting, the check
-- layout in KEYS, token buckets, concurrency-zset expiry and budget purges. Every key
-- a script touches comes from KEYS (Redis Cluster routes and checks by KEYS).
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
