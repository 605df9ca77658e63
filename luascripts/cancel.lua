#!lua flags=allow-oom
-- uses: lib.lua
-- cancel: a waiter gives up. It leaves every queue, and anything granted
-- under its id (a grant whose reply was lost, or that raced the caller's
-- cancellation) is returned. Idempotent.
--
-- KEYS[1]  config hash
-- ARGV[3]  waiter id
-- Returns {"1"}.

local id = id_arg(ARGV[3], 'waiter id')
local now = clock()
touch_cfg(now)
reclaim(now)
remove_waiter(id)
retire(id, 1, 1, 1)
return done({'1'})
