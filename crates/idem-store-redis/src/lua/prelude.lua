-- Shared by every script. Times are milliseconds. ARGV[1] is the time from an injected
-- clock, or empty to read Redis's own clock, so every gateway agrees on when a lease ends.
-- Numbers are written with %d: Lua would print large ones in e-notation and lose digits.
local function s(n) return string.format('%d', n) end
-- Values as one reply, separated by spaces, a missing one as empty (which the reader then
-- finds corrupt): the client reads one string for a fraction of what an array of as many
-- strings costs it (docs/benchmarks.md, issue 33, "Redis replies and script calls"). Only
-- the last value may hold spaces.
local function joined(...)
  local out = {}
  for i = 1, select('#', ...) do out[i] = (select(i, ...)) or '' end
  return table.concat(out, ' ')
end
-- KEYS: the record, then (for the scripts that change a state) its shard's index of records
-- without a result (scored by lease end) and of completed records (scored by expiry). All
-- three share one hash slot (layout.rs), and each script keeps both indexes true in the
-- same atomic step as the record.
local k, live_idx, exp_idx = KEYS[1], KEYS[2], KEYS[3]
local now
if ARGV[1] ~= '' then
  now = tonumber(ARGV[1])
else
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
-- Whether a record exists and its retention has not ended, from its 'tok' and 'exp' fields
-- ('exp' is absent while a record is in flight or abandoned: those never expire). An
-- expired record is absent to every script, deleted or not.
local function live(tok, exp)
  return tok and ((not exp) or tonumber(exp) > now)
end
-- The fenced check of machine.rs for ARGV[2]: nil when the caller may act, else why not.
-- Returns the record's retention too, which completions need, and the fields read: 'tok',
-- 'exp', 'comp', 'ret', then the extra fields the caller names, in one HMGET.
local function fenced(...)
  local f = redis.call('HMGET', k, 'tok', 'exp', 'comp', 'ret', ...)
  if not live(f[1], f[2]) then return 'absent' end
  if f[1] ~= ARGV[2] then return 'superseded' end
  if f[3] then return 'completed' end
  return nil, tonumber(f[4]), f
end
