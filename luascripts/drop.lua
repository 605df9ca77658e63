#!lua flags=allow-oom
-- uses: lib.lua
-- drop: an operator returns the leases of dead hosts at once instead of
-- waiting for them to expire. Each is retired as a reclaim would, waking
-- whoever may move.
--
-- KEYS[1]  config hash
-- ARGV[1..3] the common arguments (lib.lua)
-- ARGV[4]  consumer whose leases to drop (ignored when ARGV[5] is 1)
-- ARGV[5]  1 to drop every lease
-- Returns {R_UNREGISTERED} when the budget does not exist, else
-- {R_OK, count dropped}.

local consumer = ARGV[4]
local all = int(ARGV[5], 'all flag', 0, 1)
local now = clock()
local lim = lims()
if not lim then return {R_UNREGISTERED} end
touch_cfg(now)
reclaim(now)
local n = 0
for _, lid in ipairs(redis.call('ZRANGE', P .. 'lexp', 0, -1)) do
  if all == 1 or redis.call('HGET', P .. 'l:' .. lid, 'cs') == consumer then
    retire(lid, 1, 1)
    redis.call('ZREM', P .. 'lexp', lid)
    n = n + 1
  end
end
return done({R_OK, I(n)})
