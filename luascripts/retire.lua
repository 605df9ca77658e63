#!lua flags=allow-oom
-- uses: lib.lua
-- retire: return parts of a lease. Parts already returned, and unknown or
-- reclaimed leases, are ignored, so a retried call changes nothing.
--
-- KEYS[1]  config hash
-- ARGV[1..3] the common arguments (lib.lua)
-- ARGV[4]  lease id
-- ARGV[5]  parts: 1 request slot + 2 open body (1..3). Memory is the
--          host's own and never reaches the scripts: a parts value with
--          bit 4 set is refused (RBINVAL), since only a caller of this
--          build runs this script and it never sends one.
-- ARGV[6]  the session the lease was granted in (or moved to)
-- Returns {R_OK}.

local id = id_arg(ARGV[4], 'lease id')
local parts = int(ARGV[5], 'parts', 1, 3, true)
local sid = id_arg(ARGV[6], 'session id', true)
local now = clock()
touch_cfg(now)
reclaim(now)
local r = parts % 2
retire(id, sid, r, (parts - r) / 2, nil, true)
return done(REPLY_OK)
