#!lua flags=allow-oom
-- uses: lib.lua
-- drop: an operator returns the leases of dead hosts at once instead of
-- waiting for them to expire. Each is retired as a reclaim would, waking
-- whoever may move, and noted in its session's dropped set, so a holder
-- that is still alive hears at its next heartbeat that the lease is lost.
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
for _, sid in ipairs(redis.call('ZRANGE', P .. 'sexp', 0, -1)) do
  local leases = redis.call('HGETALL', lxkey(sid))
  for i = 1, #leases, 2 do
    local l = leases[i] ~= '' and lease_unpack(leases[i + 1]) -- '': lib.lua, lease_put
    if l and (all == 1 or l.cs == consumer) then
      retire(leases[i], sid, 1, 1, leases[i + 1])
      local sd = P .. 'sd:' .. sid
      redis.call('SADD', sd, leases[i])
      expire(sd, IDLE)
      n = n + 1
    end
  end
end
return done({R_OK, I(n)})
