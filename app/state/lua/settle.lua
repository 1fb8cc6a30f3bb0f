-- settle: KEYS[1] = the settled marker, KEYS[2] = the ledger id index (hash request id ->
-- stream entry id), KEYS[3] = the ledger stream, KEYS[4] = the keys' last-used hash,
-- KEYS[5] = the tenant's pending zset, KEYS[6] = its pending hash, KEYS[7] = its ledger
-- session index, then the checks' keys (prelude `checks`). ARGV[1] = JSON {id, rid, keep, reserved, used_tokens, used_usd,
-- key_id, ended, rates, conc, budgets} (`id` = the admitted request, `rid` = the record's
-- request id); ARGV[2] = the LedgerRecord JSON.
-- Returns 0 (and changes nothing) when the request id was settled before — unless its
-- record is `lost` (swept while this settlement could not reach the store): then this
-- record replaces it, the difference between what it used and what the lost record
-- billed is billed (a refund when negative), and it returns 1. A record whose request id
-- is in the index already is not written again otherwise (the first one stays).
local q = cjson.decode(ARGV[1])
if not redis.call('SET', KEYS[1], '1', 'NX', 'EX', q.keep) then
  local entry = redis.call('HGET', KEYS[2], q.rid)
  if not entry then return 0 end
  local old = redis.call('XRANGE', KEYS[3], entry, entry)[1]
  if not old then return 0 end
  local lost = cjson.decode(old[2][2])
  if lost.status ~= 'lost' then return 0 end
  checks(q, 7)
  local tokens = q.used_tokens - (lost.prompt_tokens + lost.completion_tokens)
  local usd = q.used_usd - lost.cost_usd
  for _, b in ipairs(q.budgets) do bill(b, q.id, tokens, usd) end
  key_used(KEYS[4], q.key_id, q.ended)
  redis.call('XDEL', KEYS[3], entry)
  redis.call('HDEL', KEYS[2], q.rid)
  return append_ledger(KEYS[2], KEYS[3], q.rid, ARGV[2], KEYS[7])
end
redis.call('ZREM', KEYS[5], q.id)
redis.call('HDEL', KEYS[6], q.id)
checks(q, 7)
for _, c in ipairs(q.conc) do redis.call('ZREM', c.k, q.id) end
for _, b in ipairs(q.budgets) do bill(b, q.id, q.used_tokens, q.used_usd) end
local refund = q.reserved - q.used_tokens
if refund > 0 then
  for _, r in ipairs(q.rates) do
    if r.kind == 'tokens' then
      local level = bucket(r.k, r.limit)
      save_bucket(r.k, r.limit, math.max(level, math.min(r.limit, level + refund)))
    end
  end
end
key_used(KEYS[4], q.key_id, q.ended)
append_ledger(KEYS[2], KEYS[3], q.rid, ARGV[2], KEYS[7])
return 1
