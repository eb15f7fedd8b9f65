-- Reserve one request, ARGV[6] tokens and a concurrency slot, or nothing. Runs after
-- _prelude.lua. KEYS: the tenant's bucket hash, in-flight sorted set, and the
-- reservation's hold key (set on a grant to the tokens charged, for the lease: release.lua
-- refunds only what a hold records, once, so a release replayed after a timeout, or one
-- cancelling a reservation whose reply was lost, can never refund twice). ARGV: now,
-- request rate, request burst, token rate, token capacity, tokens needed, concurrency cap,
-- member (reservation id), lease (s), Retry-After for a full concurrency cap (s).
-- Returns {ok (1/0), limit ('' or the refusing limit), retry_after_s, request tokens left
-- (-1: unlimited), token tokens left (-1: unlimited), in flight}.
local tok_rate, tok_cap, need = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
local conc_cap, member, lease = tonumber(ARGV[7]), ARGV[8], tonumber(ARGV[9])
local conc_retry = tonumber(ARGV[10])
local function wait(tokens, updated, rate, amount)
  return math.max(0, math.max(now, updated) + (amount - tokens) / rate - now)
end
local s = redis.call('HMGET', KEYS[1], 'rt', 'ru', 'tt', 'tu')
local rt, ru, tt, tu
if req_rate > 0 then rt, ru = refill(s[1], s[2], req_rate, req_cap) end
if tok_rate > 0 then tt, tu = refill(s[3], s[4], tok_rate, tok_cap) end
local in_flight = 0
if conc_cap > 0 then
  redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
  in_flight = redis.call('ZCARD', KEYS[2])
end
local limit, retry = '', 0
local function refuse(w, name)
  if limit == '' or w >= retry then limit, retry = name, w end
end
if req_rate > 0 and rt < 1 then refuse(wait(rt, ru, req_rate, 1), 'requests') end
if tok_rate > 0 and tt < need then
  if need > tok_cap then refuse(math.huge, 'too_large')
  else refuse(wait(tt, tu, tok_rate, need), 'tokens') end
end
if conc_cap > 0 and in_flight >= conc_cap then refuse(conc_retry, 'concurrent') end
if limit == '' then
  if req_rate > 0 then rt = rt - 1 end
  if tok_rate > 0 then tt = tt - need end
  if conc_cap > 0 then
    redis.call('ZADD', KEYS[2], now + lease, member)
    redis.call('PEXPIRE', KEYS[2], math.ceil(lease * 1000) + 1000)
    in_flight = in_flight + 1
  end
  redis.call('SET', KEYS[3], fmt(tok_rate > 0 and need or 0), 'PX', math.ceil(lease * 1000) + 1000)
end
if req_rate > 0 then keep('rt', 'ru', rt, ru, req_cap, req_rate) end
if tok_rate > 0 then keep('tt', 'tu', tt, tu, tok_cap, tok_rate) end
if #fields > 0 then
  redis.call('HSET', KEYS[1], unpack(fields))
  if ARGV[1] == '' then
    -- once full again the state says nothing a missing key does not
    redis.call('PEXPIRE', KEYS[1], math.ceil(full_in * 1000) + 1000)
  end
end
return {limit == '' and 1 or 0, limit, fmt(retry), fmt(rt or -1), fmt(tt or -1), in_flight}
