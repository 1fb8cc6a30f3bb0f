-- pending_due: KEYS[1] = a tenant's pending zset (request id -> expiry), KEYS[2] = its
-- pending hash (request id -> JSON {record, conc, budgets}); ARGV[1] = the most entries
-- to return. Returns {ZCARD, id, expiry, info, id, expiry, info, ...}: the entries whose
-- expiry passed, oldest first (info nil when the hash lacks it). Changes nothing.
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', num(now), 'WITHSCORES', 'LIMIT', 0,
                       tonumber(ARGV[1]))
local out = {redis.call('ZCARD', KEYS[1])}
for i = 1, #due, 2 do
  out[#out + 1] = due[i]
  out[#out + 1] = due[i + 1]
  out[#out + 1] = redis.call('HGET', KEYS[2], due[i])
end
return out
