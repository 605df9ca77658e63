#!lua flags=allow-oom
-- uses: lib.lua
-- cancel: a waiter gives up. It leaves every queue, and anything granted
-- under its id (a grant whose reply was lost, or that raced the caller's
-- cancellation) is returned. Idempotent.
--
-- KEYS[1]  config hash
-- ARGV[1..3] the common arguments (lib.lua)
-- ARGV[4]  waiter id
-- Returns {R_OK}.

local id = id_arg(ARGV[4], 'waiter id')
local now = clock()
touch_cfg(now)
reclaim(now)
remove_waiter(id)
retire(id, 1, 1)
return done(REPLY_OK)
