-- ARGV: now, token, encoded response. Returns 'NOW CAT AAT LEX RET ATT REP FP', one string
-- (the fingerprint's bytes last: they may hold spaces): the fields of the completed record
-- its caller does not already have (it has the scope, the key, the token and the response,
-- and the completion time and expiry follow from now and ret). Not the whole record: reading
-- the response back costs Redis and the client more than the rest of the completion. Or
-- {refusal}.
local refused, ret, f = fenced('fp', 'cat', 'aat', 'lex', 'att', 'rep')
if refused then return {refused} end
redis.call('HSET', k, 'comp', s(now), 'by', '0', 'exp', s(now + ret), 'resp', ARGV[3])
-- Redis's own expiry deletes the record when retention ends; reads check 'exp' meanwhile.
redis.call('PEXPIRE', k, math.max(ret, 1))
redis.call('ZREM', live_idx, k)
redis.call('ZADD', exp_idx, s(now + ret), k)
return joined(s(now), f[6], f[7], f[8], f[4], f[9], f[10], f[5])
