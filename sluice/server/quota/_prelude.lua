-- Shared by reserve.lua and release.lua (prepended to each): the clock (an injected `now`
-- for tests in ARGV[1], else Redis's own TIME), the request-bucket limits, number
-- formatting, the refill rule, and `keep`, which stages a bucket's new level for HSET and
-- tracks when every bucket is full again.
--
-- The same rule as TenantQuota (and TokenBucket) in sluice.policy.quota: refill each bucket
-- to now, take one request, `need` tokens and a slot, or nothing; a refusal names the limit
-- with the longest wait. A limit of 0 means "not limited". Numbers cross as %.17g strings,
-- since Redis truncates Lua numbers in replies to integers.
local now
if ARGV[1] ~= '' then
  now = tonumber(ARGV[1])
else
  local t = redis.call('TIME')
  now = tonumber(t[1]) + tonumber(t[2]) / 1000000
end
local req_rate, req_cap = tonumber(ARGV[2]), tonumber(ARGV[3])
local function fmt(x) return string.format('%.17g', x) end
local function refill(tokens, updated, rate, cap)
  if not tokens then return cap, now end
  tokens, updated = tonumber(tokens), tonumber(updated)
  if now - updated <= 0 then return math.min(tokens, cap), updated end
  return math.min(cap, tokens + rate * (now - updated)), now
end
local fields, full_in = {}, 0
local function keep(tokens_key, updated_key, tokens, updated, cap, rate)
  fields[#fields + 1] = tokens_key; fields[#fields + 1] = fmt(tokens)
  fields[#fields + 1] = updated_key; fields[#fields + 1] = fmt(updated)
  full_in = math.max(full_in, (cap - tokens) / rate)
end
