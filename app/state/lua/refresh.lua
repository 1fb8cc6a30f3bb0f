-- refresh: ARGV[1] = JSON {ttl, items: [{id, conc, budgets}]}; extends live holds only.
local q = cjson.decode(ARGV[1])
local until_ = num(now + q.ttl)
local function extend(z, id)
  local s = redis.call('ZSCORE', z, id)
  if s and tonumber(s) > now then redis.call('ZADD', z, 'XX', until_, id); return true end
  return false
end
for _, it in ipairs(q.items) do
  for _, z in ipairs(it.conc) do if extend(z, it.id) then touch(z) end end
  for _, k in ipairs(it.budgets) do extend(k .. ':held', it.id) end
end
return 1
