-- admit: KEYS = the checks' keys (prelude `checks`), then, when `pending`, the tenant's
-- pending zset and pending hash; ARGV[1] = JSON {id, prompt, max_out, min_out, pin, pout,
-- ttl, pending, rates: [{kind, limit}], conc: [{limit}], budgets: [{unit, limit, exp}]};
-- ARGV[2] = the pending entry (JSON {record, conc, budgets}) when `pending`. Order and
-- rules: app/state/protocol.py. Changes nothing unless every check passes; a refusal
-- names its check by the position of its key (`scope`).
local q = cjson.decode(ARGV[1])
checks(q, 0)
local level = {}
for i, r in ipairs(q.rates) do level[i] = bucket(r.k, r.limit) end
local function states(cost)
  local out = {}
  for i, r in ipairs(q.rates) do
    local left = level[i]
    if cost then left = left - (r.kind == 'requests' and 1 or cost) end
    out[i] = {math.max(0, math.floor(left)), (r.limit - left) * 60 / r.limit}
  end
  return out
end
local function refuse(reason, at, retry)
  return cjson.encode({ok = false, reason = reason, scope = at, retry = retry, rates = states()})
end
for _, c in ipairs(q.conc) do
  redis.call('ZREMRANGEBYSCORE', c.k, '-inf', num(now))
  if redis.call('ZCARD', c.k) >= c.limit then return refuse('concurrency', c.at, 1) end
end
for i, r in ipairs(q.rates) do
  if r.kind == 'requests' and level[i] < 1 then
    return refuse('requests', r.at, (1 - level[i]) * 60 / r.limit)
  end
end
local allowance, refusing = q.max_out, nil
for _, b in ipairs(q.budgets) do
  local used, held = budget(b)
  local avail = b.limit - used - held
  local fits = allowance
  if b.unit == 'tokens' then fits = math.floor(avail - q.prompt)
  elseif q.pout > 0 then fits = math.floor((avail - q.prompt * q.pin) / q.pout)
  elseif avail - q.prompt * q.pin < 0 then fits = -1 end
  if fits < allowance then allowance, refusing = fits, b.at end
end
if refusing and allowance < math.min(q.min_out, q.max_out) then
  return refuse('budget', refusing, 0)
end
local cost = q.prompt + allowance
for i, r in ipairs(q.rates) do
  if r.kind == 'tokens' and level[i] < cost then
    if cost > r.limit then return refuse('tokens', r.at, 60) end
    return refuse('tokens', r.at, (cost - level[i]) * 60 / r.limit)
  end
end
for i, r in ipairs(q.rates) do
  save_bucket(r.k, r.limit, level[i] - (r.kind == 'requests' and 1 or cost))
end
for _, c in ipairs(q.conc) do
  redis.call('ZADD', c.k, num(now + q.ttl), q.id)
  touch(c.k)
end
local usd = q.prompt * q.pin + allowance * q.pout
for _, b in ipairs(q.budgets) do
  redis.call('ZADD', b.held, num(now + q.ttl), q.id)
  redis.call('HSET', b.amt, q.id, num(b.unit == 'tokens' and cost or usd))
  expire_budget(b)
end
if q.pending then  -- written as `lost` by sweep if it expires unsettled
  redis.call('ZADD', KEYS[#KEYS - 1], num(now + q.ttl), q.id)
  redis.call('HSET', KEYS[#KEYS], q.id, ARGV[2])
end
return cjson.encode({ok = true, allowance = allowance, tokens = cost, usd = num(usd),
                     rates = states(cost)})
