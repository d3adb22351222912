-- wrk script for bench/run.sh: every request is a POST of a NEW pingback
--   id=<unique digits>&code=<token>
-- (form-encoded, as 2captcha and rucaptcha send it). A repeated id would be
-- answered from the dedupe path without a write, so each wrk thread counts
-- its own requests and the id is <run prefix><thread number><counter>.
-- BENCH_PREFIX (digits, from run.sh) keeps ids unique across rounds that
-- share one store. The same requests go to /bare and /cb.

local prefix = os.getenv("BENCH_PREFIX") or tostring(os.time())
local threads = {}
local next_thread = 1

function setup(thread)
  thread:set("tid", next_thread)
  next_thread = next_thread + 1
  table.insert(threads, thread)
end

local counter = 0
local headers = { ["Content-Type"] = "application/x-www-form-urlencoded" }

function init(args)
  -- tid is set by setup() before init runs in the thread.
  tid = tid or 0
end

function request()
  counter = counter + 1
  local body = string.format("id=%s%02d%010d&code=03AGdBq24PBCbwiDRaS_MJ7Z", prefix, tid, counter)
  return wrk.format("POST", nil, headers, body)
end

-- One machine-readable line for run.sh; latencies in microseconds.
function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    "RESULT requests=%d duration_us=%d p50_us=%d p90_us=%d p99_us=%d max_us=%d non2xx=%d connect=%d read=%d write=%d timeout=%d\n",
    summary.requests, summary.duration,
    latency:percentile(50), latency:percentile(90), latency:percentile(99), latency.max,
    e.status, e.connect, e.read, e.write, e.timeout))
end
