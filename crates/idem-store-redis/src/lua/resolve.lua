-- ARGV: now, 'release' or 'complete', encoded response, new token.
-- Returns {'ok', now, record} after a completion, {'ok'} after a release, or {'not_found'},
-- {'completed'}, {'in_flight'}.
local f = redis.call('HMGET', k, 'tok', 'exp', 'comp', 'lex', 'ret')
if not live(f[1], f[2]) then return {'not_found'} end
if f[3] then return {'completed'} end
if tonumber(f[4]) > now then return {'in_flight'} end
redis.call('ZREM', live_idx, k)
if ARGV[2] == 'release' then
  redis.call('DEL', k)
  return {'ok'}
end
local ret = tonumber(f[5])
-- A new token: the abandoned executor must not complete over the operator's decision.
redis.call('HSET', k, 'comp', s(now), 'by', '1', 'exp', s(now + ret), 'resp', ARGV[3],
  'tok', ARGV[4])
local rec = redis.call('HGETALL', k)
redis.call('PEXPIRE', k, math.max(ret, 1))
redis.call('ZADD', exp_idx, s(now + ret), k)
return {'ok', s(now), rec}
