-- Settle one held reservation's tokens down to ARGV[6] (its estimate was an upper bound,
-- and the exact count is now known): what its hold (KEYS[3]) records above that goes back
-- to the token bucket, never above capacity; its request and its slot stay taken, and the
-- hold then records ARGV[6], its lease unchanged. Never takes more. Runs after
-- _prelude.lua. KEYS and ARGV 1-5 as in reserve.lua. Without a hold (released already,
-- never granted, or past its lease) nothing changes. Returns {what the hold records now
-- (-1: no hold), token tokens left (-1: not known: unlimited, or nothing given back)}.
local tok_rate, tok_cap = tonumber(ARGV[4]), tonumber(ARGV[5])
local target = math.max(0, tonumber(ARGV[6]))
local held = redis.call('GET', KEYS[3])
if not held then return {'-1', '-1'} end
local refund = tonumber(held) - target
if refund <= 0 then return {held, '-1'} end
redis.call('SET', KEYS[3], fmt(target), 'KEEPTTL')
local s = redis.call('HMGET', KEYS[1], 'rt', 'ru', 'tt', 'tu')
if tok_rate <= 0 then return {fmt(target), '-1'} end
if not s[3] then return {fmt(target), fmt(tok_cap)} end  -- expired: full
-- the request bucket is kept too (refilled), so the key's expiry covers both
if req_rate > 0 and s[1] then
  local rt, ru = refill(s[1], s[2], req_rate, req_cap)
  keep('rt', 'ru', rt, ru, req_cap, req_rate)
end
local tt, tu = refill(s[3], s[4], tok_rate, tok_cap)
tt = math.min(tok_cap, tt + refund)
keep('tt', 'tu', tt, tu, tok_cap, tok_rate)
redis.call('HSET', KEYS[1], unpack(fields))
if ARGV[1] == '' and redis.call('PTTL', KEYS[1]) >= 0 then
  redis.call('PEXPIRE', KEYS[1], math.ceil(full_in * 1000) + 1000)
end
return {fmt(target), fmt(tt)}
