-- ARGV: now, token, '1' if the record must be completed. Returns 1 if the record is held by
-- that token (and completed, if asked), else 0: after a WAIT, that what it counted is this
-- write (a cluster client may have sent the WAIT to another node after a failover).
local f = redis.call('HMGET', k, 'tok', 'comp')
if f[1] ~= ARGV[2] then return 0 end
if ARGV[3] == '1' and not f[2] then return 0 end
return 1
