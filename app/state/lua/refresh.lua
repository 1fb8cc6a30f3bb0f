-- refresh: KEYS = reservation zsets (concurrency slots, budget `:held` zsets and the
-- pending zset, of one tenant); ARGV[1] = ttl_s; ARGV[2i] = the request id held in KEYS[i], ARGV[2i + 1] =
-- '1' when KEYS[i] is a concurrency zset (whose key expiry follows its newest member).
-- Extends live holds only.
local until_ = num(now + tonumber(ARGV[1]))
for i, z in ipairs(KEYS) do
  local id = ARGV[2 * i]
  local s = redis.call('ZSCORE', z, id)
  if s and tonumber(s) > now then
    redis.call('ZADD', z, 'XX', until_, id)
    if ARGV[2 * i + 1] == '1' then touch(z) end
  end
end
return 1
