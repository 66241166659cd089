-- ARGV: now, fingerprint, token, lease_ms, retention_ms, retry (1/0), scope, key.
-- Acquired: 'LEASE_END ATTEMPT', one string. Otherwise {0, now, the record's fields as
-- HGETALL gives them (before a replay is counted)}.
local fp, tok, lease, ret = ARGV[2], ARGV[3], tonumber(ARGV[4]), ARGV[5]
local f = redis.call('HMGET', k, 'tok', 'exp', 'fp', 'comp', 'lex', 'att')
if not live(f[1], f[2]) then
  if f[1] then redis.call('DEL', k) end
  -- Its expired predecessor's entry, which Redis's own expiry leaves behind.
  redis.call('ZREM', exp_idx, k)
  redis.call('HSET', k, 'sc', ARGV[7], 'k', ARGV[8], 'fp', fp, 'tok', tok, 'cat', s(now),
    'aat', s(now), 'lex', s(now + lease), 'ret', ret, 'att', '1', 'rep', '0')
  redis.call('ZADD', live_idx, s(now + lease), k)
  return joined(s(now + lease), '1')
end
if f[3] ~= fp then return {0, s(now), redis.call('HGETALL', k)} end
if f[4] then
  local rec = redis.call('HGETALL', k)
  redis.call('HINCRBY', k, 'rep', 1)
  return {0, s(now), rec}
end
if tonumber(f[5]) > now or ARGV[6] ~= '1' then
  return {0, s(now), redis.call('HGETALL', k)}
end
-- Abandoned, and the policy is to retry: take it over under a new token.
local att = s(math.min(tonumber(f[6]) + 1, 4294967295))
redis.call('HSET', k, 'tok', tok, 'aat', s(now), 'lex', s(now + lease), 'ret', ret, 'att', att)
redis.call('ZADD', live_idx, s(now + lease), k)
return joined(s(now + lease), att)
