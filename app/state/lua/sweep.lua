-- sweep: write the `lost` records of one tenant's expired pending requests.
-- KEYS[1] = the tenant's pending zset, KEYS[2] = its pending hash, KEYS[3] = the ledger
-- id index, KEYS[4] = the ledger stream, KEYS[5] = the keys' last-used hash, KEYS[6] =
-- the ledger session index; then per
-- entry: its settled marker, its concurrency zsets, per budget its counter, `:held` and
-- `:amt`. ARGV[1] = JSON {keep, entries: [{id, rid, key_id, ended, tokens, usd, conc
-- (how many zsets), budgets: [{unit, exp}]}]}; ARGV[1 + i] = entry i's LedgerRecord JSON.
-- An entry still pending and expired (a refresh or a settle since it was read wins) is
-- removed; unless settled before (the marker settle sets), its slots and holds are
-- released, `tokens`/`usd` billed to its budgets and its record appended, like settle.
-- Returns the number of records written.
local q = cjson.decode(ARGV[1])
local n, wrote = 6, 0
for i, e in ipairs(q.entries) do
  local marker = KEYS[n + 1]
  n = n + 1
  local conc = {}
  for j = 1, e.conc do conc[j] = KEYS[n + j] end
  n = n + e.conc
  for _, b in ipairs(e.budgets) do
    b.k, b.held, b.amt = KEYS[n + 1], KEYS[n + 2], KEYS[n + 3]
    n = n + 3
  end
  local s = redis.call('ZSCORE', KEYS[1], e.id)
  if s and tonumber(s) <= now then
    redis.call('ZREM', KEYS[1], e.id)
    redis.call('HDEL', KEYS[2], e.id)
    if redis.call('SET', marker, '1', 'NX', 'EX', q.keep) then
      for _, c in ipairs(conc) do redis.call('ZREM', c, e.id) end
      for _, b in ipairs(e.budgets) do bill(b, e.id, e.tokens, e.usd) end
      key_used(KEYS[5], e.key_id, e.ended)
      wrote = wrote + append_ledger(KEYS[3], KEYS[4], e.rid, ARGV[i + 1], KEYS[6])
    end
  end
end
return wrote
