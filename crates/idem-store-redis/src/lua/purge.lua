-- ARGV: now. Deletes the record if it is completed and expired, and its expiry-index entry
-- with it. Returns {'deleted'}, {'absent'} (Redis's own expiry got there first: only the
-- entry is removed), {'never'} (in flight or abandoned: its completion indexes it again), or
-- {'later'} (its retention ends later: the entry is moved there).
local f = redis.call('HMGET', k, 'tok', 'exp')
if f[1] and not f[2] then
  redis.call('ZREM', exp_idx, k)
  return {'never'}
end
if f[1] and tonumber(f[2]) > now then
  redis.call('ZADD', exp_idx, f[2], k)
  return {'later'}
end
redis.call('ZREM', exp_idx, k)
if f[1] then
  redis.call('DEL', k)
  return {'deleted'}
end
return {'absent'}
