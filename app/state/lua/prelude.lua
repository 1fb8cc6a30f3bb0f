-- Prepended to every script but principal.lua: the Redis clock (`now`), number
-- formatting, token buckets, concurrency-zset expiry and budget purges.
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1e6
local function num(x) return string.format('%.17g', x) end
local function int(x) return string.format('%.0f', math.ceil(x)) end
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
local function budget(k)
  local gone = redis.call('ZRANGEBYSCORE', k .. ':held', '-inf', num(now))
  for i = 1, #gone, 100 do
    redis.call('HDEL', k .. ':amt', unpack(gone, i, math.min(i + 99, #gone)))
  end
  redis.call('ZREMRANGEBYSCORE', k .. ':held', '-inf', num(now))
  local held = 0
  for _, v in ipairs(redis.call('HVALS', k .. ':amt')) do held = held + tonumber(v) end
  return tonumber(redis.call('HGET', k, 'used') or '0'), held
end
local function expire_budget(b)
  for _, k in ipairs({b.k, b.k .. ':held', b.k .. ':amt'}) do
    redis.call('PEXPIREAT', k, int(b.exp * 1000))
  end
end
