"""The Lua scripts the Redis Streams broker runs server-side (brokers/redis_streams.py): batches that
would otherwise cost one round trip, and client CPU, per entry or per stream."""

# KEYS: stream. ARGV: field, maxlen ('' for none), payloads... One command for a batch: redis-py spends
# far more client CPU per entry on a pipeline of N XADDs (docs/performance.md, "Message path").
ADD_MANY = """
local out = {}
for i = 3, #ARGV do
  if ARGV[2] == '' then
    out[i - 2] = redis.call('XADD', KEYS[1], '*', ARGV[1], ARGV[i])
  else
    out[i - 2] = redis.call('XADD', KEYS[1], 'MAXLEN', '~', ARGV[2], '*', ARGV[1], ARGV[i])
  end
end
return out
"""

# KEYS: streams. ARGV: group, then per stream its id count and ids. Several streams' XACKs in one
# round trip: the trainer acks a batch's rollouts and annotations together (docs/performance.md).
ACK_MANY = """
local n, i = 0, 2
for k = 1, #KEYS do
  local last = i + tonumber(ARGV[i])
  for first = i + 1, last, 500 do
    n = n + redis.call('XACK', KEYS[k], ARGV[1], unpack(ARGV, first, math.min(first + 499, last)))
  end
  i = last + 1
end
return n
"""
# KEYS: stream to add to, stream to ack. ARGV: field, maxlen ('' for none), group, id count, ids...,
# payloads... An annotator's batch: its annotations appended and its rollouts acked atomically, in one
# round trip (the ack can never land without the annotations it stands for).
ADD_AND_ACK = """
local nids = tonumber(ARGV[4])
local out = {}
for i = 5 + nids, #ARGV do
  if ARGV[2] == '' then
    out[#out + 1] = redis.call('XADD', KEYS[1], '*', ARGV[1], ARGV[i])
  else
    out[#out + 1] = redis.call('XADD', KEYS[1], 'MAXLEN', '~', ARGV[2], '*', ARGV[1], ARGV[i])
  end
end
for first = 5, 4 + nids, 500 do
  redis.call('XACK', KEYS[2], ARGV[3], unpack(ARGV, first, math.min(first + 499, 4 + nids)))
end
return out
"""

LAG_SCRIPT = """
local n, last = 0, ARGV[1]
while n < tonumber(ARGV[2]) do
  local batch = redis.call('XRANGE', KEYS[1], '(' .. last, '+', 'COUNT', 200)
  if #batch == 0 then break end
  n = n + #batch
  last = batch[#batch][1]
end
return n
"""
