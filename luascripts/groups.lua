#!lua
-- groups: the registry of a sharded budget's groups, which is how Usage,
-- Admin and the metrics exporter find every group of a budget without
-- scanning the keyspace. It lives in the slot of the budget's name, apart
-- from every group it lists, so it is written by its own small call (a
-- script cannot reach keys in other slots), never by an admission.
--
-- KEYS[1]  the registry, a zset "rb:{<hex of name>}:groups": member = hex
--          of a shard key, score = Redis time (ms) the group was last listed
-- ARGV[1]  idle TTL, ms: when listing, a group not listed again within it
--          is dropped, as its own keys expire after the same time without
--          use (only writers prune: a reader, such as an operator's tool,
--          does not know the hosts' idle TTL)
-- ARGV[2]  clock: "" for Redis TIME, or microseconds (the test clock)
-- ARGV[3…] hex shard keys to list now (none: only read)
-- Returns the hex shard keys in the registry, in no order. An entry may
-- name a group whose keys have expired since; its calls find no config.

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
local reg = KEYS[1]
if #ARGV > 2 then
  local args = {}
  for i = 3, #ARGV do
    if not string.match(ARGV[i], '^%x*$') then error({err = 'RBINVAL shard key is not hex'}) end
    args[#args + 1] = string.format('%d', now)
    args[#args + 1] = ARGV[i]
  end
  redis.call('ZADD', reg, unpack(args))
  redis.call('PEXPIRE', reg, idle)
  redis.call('ZREMRANGEBYSCORE', reg, '-inf', string.format('(%d', now - idle))
end
return redis.call('ZRANGE', reg, 0, -1)
