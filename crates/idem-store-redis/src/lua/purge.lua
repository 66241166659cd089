-- ARGV: now. Deletes the record if it is completed and expired. Returns {'deleted'},
-- {'absent'}, {'never'} (in flight or abandoned), or {'later', expiry}.
local f = redis.call('HMGET', k, 'tok', 'exp')
if not f[1] then return {'absent'} end
if not f[2] then return {'never'} end
if tonumber(f[2]) <= now then
  redis.call('DEL', k)
  return {'deleted'}
end
return {'later', f[2]}
