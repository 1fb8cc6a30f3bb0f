-- settle: ARGV[1] = JSON {id, marker, keep, reserved, used_tokens, used_usd, key_id,
-- last_used, ended, ledger, rates, conc, budgets}; ARGV[2] = the LedgerRecord JSON.
-- Returns 0 (and changes nothing) when the request id was settled before.
local q = cjson.decode(ARGV[1])
if not redis.call('SET', q.marker, '1', 'NX', 'EX', q.keep) then return 0 end
for _, c in ipairs(q.conc) do redis.call('ZREM', c.k, q.id) end
for _, b in ipairs(q.budgets) do
  redis.call('ZREM', b.k .. ':held', q.id)
  redis.call('HDEL', b.k .. ':amt', q.id)
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
  local last = redis.call('HGET', q.last_used, q.key_id)
  if not last or tonumber(last) < q.ended then
    redis.call('HSET', q.last_used, q.key_id, num(q.ended))
  end
end
redis.call('XADD', q.ledger, '*', 'record', ARGV[2])
return 1
