#!lua flags=allow-oom
-- uses: lib.lua
-- retire: return parts of a lease. Parts already returned, and unknown or
-- reclaimed leases, are ignored, so a retried call changes nothing.
--
-- KEYS[1]  config hash
-- ARGV[3]  lease id
-- ARGV[4]  parts: 1 request slot + 2 open body + 4 memory (1..7)
-- Returns {"1"}.

local id = id_arg(ARGV[3], 'lease id')
local parts = int(ARGV[4], 'parts', 1, 7)
local now = clock()
touch_cfg(now)
reclaim(now)
retire(id, parts % 2, math.floor(parts / 2) % 2, math.floor(parts / 4) % 2)
return done({'1'})
