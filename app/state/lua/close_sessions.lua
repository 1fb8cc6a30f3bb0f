-- close_sessions: claim one tenant's open sessions idle since before ARGV[1].
-- KEYS[1] = the tenant's open-sessions zset (session id -> last activity);
-- ARGV[1] = the bound (epoch seconds, exclusive), ARGV[2] = at most this many.
-- Each claimed session leaves the zset in this same step, so one caller gets it.
local ids = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', '(' .. ARGV[1], 'LIMIT', 0, ARGV[2])
if #ids > 0 then redis.call('ZREM', KEYS[1], unpack(ids)) end
return ids
