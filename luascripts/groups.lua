#!lua
-- groups: the registry of a sharded budget, in the slot of the budget's
-- name, apart from every group it lists: the groups (which is how Usage,
-- Admin and the metrics exporter find them all without scanning the
-- keyspace) and the budget's limits (so a host whose limits differ is
-- refused at start, before any group exists). A script cannot reach keys
-- in other slots, so this is a small call of its own, never part of an
-- admission.
--
-- KEYS[1]  the group list, a zset "rb:{<hex of name>}:groups": member =
--          hex of a shard key, score = Redis time (ms) it was last listed
-- KEYS[2]  the limits, a string "rb:{<hex of name>}:limits" (canonical JSON)
-- ARGV[1]  idle TTL, ms: when listing, a group not listed again within it
--          is dropped, as its own keys expire after the same time without
--          use (only writers prune: a reader, such as an operator's tool,
--          does not know the hosts' idle TTL)
-- ARGV[2]  clock: "" for Redis TIME, or microseconds (the test clock)
-- ARGV[3]  limits JSON to check or store ("" to leave them alone)
-- ARGV[4]  1 to replace differing stored limits, else 0
-- ARGV[5…] hex shard keys to list now (none: only read)
-- Returns {R_OK, stored limits JSON ("" if none), hex shard keys...}, or
-- {R_CONFLICT, stored limits JSON} when ARGV[3] differs from the stored
-- limits and ARGV[4] is 0 (nothing is written then). A listed key may
-- name a group whose keys have expired since; its calls find no config.

local R_OK, R_CONFLICT = '1', '-3'

local function int(v, name, lo, hi)
  if type(v) ~= 'string' or not string.match(v, '^%d+$') or #v > 17 then
    error({err = 'RBINVAL ' .. name .. ' is not a decimal integer'})
  end
  local n = tonumber(v)
  if n < lo or n > hi then error({err = 'RBINVAL ' .. name .. ' is out of range'}) end
  return n
end

local idle = int(ARGV[1], 'idle ttl', 1000, 86400000 * 30)
local now
if ARGV[2] == '' then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
else
  now = math.floor(int(ARGV[2], 'clock', 0, 9007199254740991) / 1000)
end
local json = ARGV[3]
local replace = int(ARGV[4], 'replace flag', 0, 1)
local reg, lk = KEYS[1], KEYS[2]

local stored = redis.call('GET', lk) or ''
if json ~= '' and stored ~= '' and stored ~= json and replace == 0 then
  return {R_CONFLICT, stored}
end
if json ~= '' then
  redis.call('SET', lk, json, 'PX', idle)
  stored = json
end
if #ARGV > 4 then
  local args = {}
  for i = 5, #ARGV do
    if not string.match(ARGV[i], '^%x*$') then error({err = 'RBINVAL shard key is not hex'}) end
    args[#args + 1] = string.format('%d', now)
    args[#args + 1] = ARGV[i]
  end
  redis.call('ZADD', reg, unpack(args))
  redis.call('PEXPIRE', reg, idle)
  if stored ~= '' then redis.call('PEXPIRE', lk, idle) end
  redis.call('ZREMRANGEBYSCORE', reg, '-inf', string.format('(%d', now - idle))
end
local out = {R_OK, stored}
for _, k in ipairs(redis.call('ZRANGE', reg, 0, -1)) do out[#out + 1] = k end
return out
