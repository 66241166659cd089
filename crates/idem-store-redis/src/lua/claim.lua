-- ARGV: now, fingerprint, token, lease_ms, retention_ms, retry (1/0), scope, key.
-- Returns {acquired 1/0, now, record fields as HGETALL gives them (before a replay is counted)}.
local fp, tok, lease, ret = ARGV[2], ARGV[3], tonumber(ARGV[4]), ARGV[5]
if not live() then
  redis.call('DEL', k)
  redis.call('HSET', k, 'sc', ARGV[7], 'k', ARGV[8], 'fp', fp, 'tok', tok, 'cat', s(now),
    'aat', s(now), 'lex', s(now + lease), 'ret', ret, 'att', '1', 'rep', '0')
  return {1, s(now), redis.call('HGETALL', k)}
end
local rec = redis.call('HGETALL', k)
if redis.call('HGET', k, 'fp') ~= fp then return {0, s(now), rec} end
if redis.call('HEXISTS', k, 'comp') == 1 then
  redis.call('HINCRBY', k, 'rep', 1)
  return {0, s(now), rec}
end
if tonumber(redis.call('HGET', k, 'lex')) > now or ARGV[6] ~= '1' then
  return {0, s(now), rec}
end
-- Abandoned, and the policy is to retry: take it over under a new token.
local att = math.min(tonumber(redis.call('HGET', k, 'att')) + 1, 4294967295)
redis.call('HSET', k, 'tok', tok, 'aat', s(now), 'lex', s(now + lease), 'ret', ret, 'att', s(att))
return {1, s(now), redis.call('HGETALL', k)}
