-- Release one reservation: free its slot (ARGV[8]) and give back a request (ARGV[6] = 1)
-- and ARGV[7] tokens (at most what its hold, KEYS[3], records), never above capacity; once:
-- without a hold (released already, never granted, or past its lease) nothing is given
-- back. Runs after _prelude.lua. KEYS and ARGV 1-5 as in reserve.lua. A bucket that has
-- expired (full again) is left absent. Returns 1 if the hold was there, else 0.
local tok_rate, tok_cap = tonumber(ARGV[4]), tonumber(ARGV[5])
local refund_req, refund_tok = tonumber(ARGV[6]), tonumber(ARGV[7])
redis.call('ZREM', KEYS[2], ARGV[8])
local held = redis.call('GET', KEYS[3])
if not held then return 0 end
redis.call('DEL', KEYS[3])
refund_tok = math.min(refund_tok, tonumber(held))
local s = redis.call('HMGET', KEYS[1], 'rt', 'ru', 'tt', 'tu')
local give_req = req_rate > 0 and refund_req > 0 and s[1] ~= false
local give_tok = tok_rate > 0 and refund_tok > 0 and s[3] ~= false
if give_req or give_tok then
  -- every bucket present is kept (refilled), so the key's expiry covers them all: set
  -- from the refunded one alone it could expire a bucket that is not full yet
  if req_rate > 0 and s[1] then
    local rt, ru = refill(s[1], s[2], req_rate, req_cap)
    keep('rt', 'ru', math.min(req_cap, rt + (give_req and refund_req or 0)), ru, req_cap,
         req_rate)
  end
  if tok_rate > 0 and s[3] then
    local tt, tu = refill(s[3], s[4], tok_rate, tok_cap)
    keep('tt', 'tu', math.min(tok_cap, tt + (give_tok and refund_tok or 0)), tu, tok_cap,
         tok_rate)
  end
end
if #fields > 0 then
  redis.call('HSET', KEYS[1], unpack(fields))
  if ARGV[1] == '' and redis.call('PTTL', KEYS[1]) >= 0 then
    redis.call('PEXPIRE', KEYS[1], math.ceil(full_in * 1000) + 1000)
  end
end
return 1
