-- ARGV: now, 'release' or 'complete', encoded response, new token.
-- Returns {'ok', now, record} after a completion, {'ok'} after a release, or {'not_found'},
-- {'completed'}, {'in_flight'}.
if not live() then return {'not_found'} end
if redis.call('HEXISTS', k, 'comp') == 1 then return {'completed'} end
if tonumber(redis.call('HGET', k, 'lex')) > now then return {'in_flight'} end
if ARGV[2] == 'release' then
  redis.call('DEL', k)
  return {'ok'}
end
local ret = tonumber(redis.call('HGET', k, 'ret'))
-- A new token: the abandoned executor must not complete over the operator's decision.
redis.call('HSET', k, 'comp', s(now), 'by', '1', 'exp', s(now + ret), 'resp', ARGV[3],
  'tok', ARGV[4])
local rec = redis.call('HGETALL', k)
redis.call('PEXPIRE', k, math.max(ret, 1))
return {'ok', s(now), rec}
