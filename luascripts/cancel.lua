#!lua flags=allow-oom
-- uses: lib.lua
-- cancel: a waiter gives up. It leaves every queue, and anything granted
-- under its id (a grant whose reply was lost, or that raced the caller's
-- cancellation) is returned. Idempotent.
--
-- KEYS[1]  config hash
-- ARGV[1..3] the common arguments (lib.lua)
-- ARGV[4]  waiter id
-- ARGV[5]  number of sessions n, then ARGV[6..5+n] the sessions a grant
--          under the id may be in (its calls' and a handoff's, as the
--          process knows them)
-- Returns {R_OK}.

local id = id_arg(ARGV[4], 'waiter id')
local n = int(ARGV[5] or '', 'session count', 0, 16)
if #ARGV ~= 5 + n then bad('session count does not match the arguments') end
local sids = {}
for i = 1, n do sids[i] = id_arg(ARGV[5 + i], 'session id', true) end
local now = clock()
touch_cfg(now)
reclaim(now)
for i = 1, n do
  remove_waiter(id, sids[i])
  retire(id, sids[i], 1, 1)
end
return done(REPLY_OK)
