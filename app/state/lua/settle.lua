-- settle: KEYS[1] = the settled marker, KEYS[2] = the ledger id index (hash request id ->
-- stream entry id), KEYS[3] = the ledger stream, KEYS[4] = the keys' last-used hash, then
-- the checks' keys (prelude `checks`). ARGV[1] = JSON {id, rid, keep, reserved,
-- used_tokens, used_usd, key_id, ended, rates, conc, budgets} (`id` = the admitted
-- request, `rid` = the record's request id); ARGV[2] = the LedgerRecord JSON.
-- Returns 0 (and changes nothing) when the request id was settled before. A record whose
-- request id is in the index already is not written again (the first one stays).
local q = cjson.decode(ARGV[1])
if not redis.call('SET', KEYS[1], '1', 'NX', 'EX', q.keep) then return 0 end
checks(q, 4)
for _, c in ipairs(q.conc) do redis.call('ZREM', c.k, q.id) end
for _, b in ipairs(q.budgets) do
  redis.call('ZREM', b.held, q.id)
  redis.call('HDEL', b.amt, q.id)
  if b.unit == 'tokens' then redis.call('HINCRBY', b.k, 'used', int(q.used_tokens))
  else redis.call('HINCRBYFLOAT', b.k, 'used', num(q.used_usd)) end
  expire_budget(b)
end
local refund = q.reserved - q.used_tokens
if refund > 0 then
  for _, r in ipairs(q.rates) do
    if r.kind == 'tokens' then
      local level = bucket(r.k, r.limit)
      save_bucket(r.k, r.limit, math.max(level, math.min(r.limit, level + refund)))
    end
  end
end
if q.key_id ~= '' then
  local last = redis.call('HGET', KEYS[4], q.key_id)
  if not last or tonumber(last) < q.ended then
    redis.call('HSET', KEYS[4], q.key_id, num(q.ended))
  end
end
if redis.call('HEXISTS', KEYS[2], q.rid) == 1 then return 1 end
-- The entry id is the Redis clock in microseconds, <ms>-<µs within the ms × 1000>, raised
-- past the stream's last id when the clock did not move on, so that the streams of
-- different tenants merge in time order (RedisStore.query_ledger).
local ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local seq = (tonumber(t[2]) % 1000) * 1000
local last = redis.call('XREVRANGE', KEYS[3], '+', '-', 'COUNT', 1)[1]
if last then
  local lms, lseq = string.match(last[1], '^(%d+)-(%d+)$')
  lms, lseq = tonumber(lms), tonumber(lseq)
  if ms < lms or (ms == lms and seq <= lseq) then ms, seq = lms, lseq + 1 end
end
local id = redis.call('XADD', KEYS[3], string.format('%.0f-%.0f', ms, seq), 'record', ARGV[2])
redis.call('HSET', KEYS[2], q.rid, id)
return 1
