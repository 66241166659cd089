-- ARGV: now, token, encoded response. Returns {'ok', now, record} or {refusal}.
local refused, ret = fenced()
if refused then return {refused} end
redis.call('HSET', k, 'comp', s(now), 'by', '0', 'exp', s(now + ret), 'resp', ARGV[3])
local rec = redis.call('HGETALL', k)
-- Redis's own expiry deletes the record when retention ends; reads check 'exp' meanwhile.
redis.call('PEXPIRE', k, math.max(ret, 1))
return {'ok', s(now), rec}
