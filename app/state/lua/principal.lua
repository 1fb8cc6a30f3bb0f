-- load_principal: ARGV = ns, key_id, tenant, team, user ('' = none). Returns the JSON of
-- {key, tenant, team limits, user limits}; the key's tenant/team/user win. Unknown key: {}.
local ns, kid, tenant, team, user = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5]
local function str(v) if type(v) == 'string' then return v end return '' end
local kj = false
if kid ~= '' then
  kj = redis.call('GET', ns .. ':key:' .. kid)
  if not kj then return {} end
  local k = cjson.decode(kj)
  tenant, team, user = str(k.tenant), str(k.team), str(k.user)
end
if tenant == '' then return {kj} end
local function limits(level, name)
  if name == '' then return false end
  return redis.call('GET', ns .. ':limits:' .. level .. ':' .. tenant .. '/' .. name)
end
return {kj, redis.call('GET', ns .. ':tenant:' .. tenant), limits('team', team),
        limits('user', user)}
