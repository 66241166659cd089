-- ARGV: now. Deletes the record if it is completed and expired. Returns {'deleted'},
-- {'absent'}, {'never'} (in flight or abandoned), or {'later', expiry}.
if redis.call('EXISTS', k) == 0 then return {'absent'} end
local exp = redis.call('HGET', k, 'exp')
if not exp then return {'never'} end
if tonumber(exp) <= now then
  redis.call('DEL', k)
  return {'deleted'}
end
return {'later', exp}
