-- ARGV: now. Returns {now, record} (empty when absent; the caller checks expiry).
return {s(now), redis.call('HGETALL', k)}
