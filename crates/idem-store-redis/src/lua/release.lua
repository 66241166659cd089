-- ARGV: now, token. Returns {'ok'} or {refusal}.
local refused = fenced()
if refused then return {refused} end
redis.call('DEL', k)
redis.call('ZREM', live_idx, k)
return {'ok'}
