-- ARGV: now, token, lease_ms. Returns {'ok', new lease end} or {refusal}.
local refused = fenced()
if refused then return {refused} end
local lex = s(now + tonumber(ARGV[3]))
redis.call('HSET', k, 'lex', lex)
redis.call('ZADD', live_idx, lex, k)
return {'ok', lex}
