#!lua flags=allow-oom
-- uses: lib.lua
-- drop: an operator returns the leases of dead hosts at once instead of
-- waiting for them to expire. Each is retired as a reclaim would, waking
-- whoever may move.
--
-- KEYS[1]  config hash
-- ARGV[3]  consumer whose leases to drop (ignored when ARGV[4] is 1)
-- ARGV[4]  1 to drop every lease
-- Returns {"-2"} when the budget does not exist, else {count}.

local consumer = ARGV[3]
local all = int(ARGV[4], 'all flag', 0, 1)
local now = clock()
local lim = lims()
if not lim then return {'-2'} end
touch_cfg(now)
reclaim(now)
local n = 0
for _, lid in ipairs(redis.call('ZRANGE', P .. 'lexp', 0, -1)) do
  if all == 1 or redis.call('HGET', P .. 'l:' .. lid, 'cs') == consumer then
    retire(lid, 1, 1, 1)
    redis.call('ZREM', P .. 'lexp', lid)
    n = n + 1
  end
end
return done({I(n)})
