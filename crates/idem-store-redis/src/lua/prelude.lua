-- Shared by every script. Times are milliseconds. ARGV[1] is the time from an injected
-- clock, or empty to read Redis's own clock, so every gateway agrees on when a lease ends.
-- Numbers are written with %d: Lua would print large ones in e-notation and lose digits.
local function clock(arg)
  if arg ~= '' then return tonumber(arg) end
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local function s(n) return string.format('%d', n) end
local k = KEYS[1]
local now = clock(ARGV[1])
-- A record whose retention ended is absent to every script, deleted or not ('exp' is
-- absent while a record is in flight or abandoned: those never expire).
local function live()
  if redis.call('EXISTS', k) == 0 then return false end
  local exp = redis.call('HGET', k, 'exp')
  return (not exp) or tonumber(exp) > now
end
-- The fenced check of machine.rs: live, holding ARGV[2], not completed.
local function fenced()
  if not live() then return 'absent' end
  if redis.call('HGET', k, 'tok') ~= ARGV[2] then return 'superseded' end
  if redis.call('HEXISTS', k, 'comp') == 1 then return 'completed' end
  return nil
end
