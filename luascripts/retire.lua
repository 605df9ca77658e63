#!lua flags=allow-oom
-- uses: lib.lua
-- retire: return parts of a lease. Parts already returned, and unknown or
-- reclaimed leases, are ignored, so a retried call changes nothing.
--
-- KEYS[1]  config hash
-- ARGV[1..3] the common arguments (lib.lua)
-- ARGV[4]  lease id
-- ARGV[5]  parts: 1 request slot + 2 open body + 4 memory (1..7)
-- Returns {R_OK}.

local id = id_arg(ARGV[4], 'lease id')
local parts = int(ARGV[5], 'parts', 1, 7)
local now = clock()
touch_cfg(now)
reclaim(now)
retire(id, parts % 2, math.floor(parts / 2) % 2, math.floor(parts / 4) % 2)
return done({R_OK})
