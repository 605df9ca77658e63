-- batch.lua: not a script of its own. Library() puts it in the function
-- library after lib.lua and the scripts' bodies (BODY, by script name), and
-- registers run_batch as two functions: one with no flags, refused whole
-- when Redis is out of memory, for a batch that carries an admitting
-- operation, and one flagged allow-oom that carries only operations of
-- allow-oom scripts (retire, cancel). It is never sent by EVALSHA.
--
-- A batch is the operations one process queued for one group while its
-- previous call to that group was in flight (redisstore's group commit).
-- Each runs as its script would alone: begin() from that operation's own
-- ARGV, then the script's body, one after the other, in the order sent,
-- all within this one atomic script run. What an operation read of the
-- config and its domains, and the time, serve the next one when both have
-- the same common arguments (see begin): nothing can change them in
-- between, and reading them again is most of what a batch would save.
-- So do the queue heads and bytes an operation read. Domains are written
-- once, at the batch's end, as the last operation that ended well left
-- them (BATCH.flush). Handoff candidates, and everything else, are each
-- operation's own.
--
-- KEYS[1]  the group's config hash (every operation's KEYS[1])
-- ARGV     per operation, in order: the script's name, the number m of its
--          arguments, then its m arguments (the common ones of lib.lua
--          first, as it would get them alone)
-- Returns one reply per operation, in order: the script's own reply, or an
-- error reply for an operation that raised one (an RBINVAL argument, say).
-- A failed operation does not stop the ones after it; what it wrote before
-- failing stays written, as it would have alone.

local function step(f, keys, argv, keep)
  begin(keys, argv, keep, true)
  return f(keys, argv)
end

-- allowed names the scripts this function may run: an admitting script
-- must never run inside the allow-oom function.
local function run_batch(keys, argv, allowed)
  -- Check the whole layout before anything runs: a broken one (a bug on
  -- the sending side) fails the batch whole, with nothing written.
  local ops, i, n = {}, 1, #argv
  while i <= n do
    local name, m = argv[i], tonumber(argv[i + 1])
    if not (allowed[name] and BODY[name]) or not m or m < 0 or m % 1 ~= 0 or i + 1 + m > n then
      bad('batch operation ' .. (#ops + 1) .. ' is malformed or not allowed here')
    end
    ops[#ops + 1] = {BODY[name], i + 2, m}
    i = i + 2 + m
  end
  BATCH.drop()
  local out = {}
  local prev -- the previous operation's arguments, if it ended well
  for k = 1, #ops do
    local f, first, m = ops[k][1], ops[k][2], ops[k][3]
    -- One copy, sized at once: a table filled entry by entry regrows as
    -- it goes (about 6k instructions an operation, by callgrind).
    local a = {unpack(argv, first, first + m - 1)}
    -- Same publish command, idle TTL and clock: this operation may start
    -- from what the previous one read (see begin).
    local keep = prev ~= nil and a[1] == prev[1] and a[2] == prev[2] and a[3] == prev[3]
    local ok, r = pcall(step, f, keys, a, keep)
    prev = nil
    if ok then
      out[k] = r
      prev = a
    elseif type(r) == 'table' and r.err then
      out[k] = {err = r.err}
    else
      out[k] = {err = 'ERR ' .. tostring(r)}
    end
  end
  BATCH.flush()
  return out
end
