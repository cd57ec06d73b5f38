-- wrk script for benches/proxy_vs_nginx.sh: every request is a `tools/call`
-- of `echo` in one MCP session (MCP_SESSION_ID) with its own id N and sentinel
-- sN; every response must be 200 and carry exactly an id still awaiting its
-- answer and that id's own `ECHO:sN`. Anything else counts as bad.

local session = os.getenv("MCP_SESSION_ID")
local next_id = 1
local pending = {}
bad = 0
first_bad = ""

local function mark_bad(reason)
  bad = bad + 1
  if first_bad == "" then
    first_bad = reason
  end
end

function request()
  local id = next_id
  next_id = next_id + 1
  pending[id] = true
  local body = '{"jsonrpc":"2.0","id":' .. id ..
    ',"method":"tools/call","params":{"name":"echo","arguments":{"sentinel":"s' .. id .. '"}}}'
  return wrk.format("POST", wrk.path, {
    ["Content-Type"] = "application/json",
    ["Accept"] = "application/json, text/event-stream",
    ["Mcp-Protocol-Version"] = "2025-06-18",
    ["Mcp-Session-Id"] = session,
  }, body)
end

function response(status, headers, body)
  if status ~= 200 then
    mark_bad("status " .. status)
    return
  end
  local id = tonumber(string.match(body, '"id":(%d+)[,}]'))
  if id == nil or not pending[id] then
    mark_bad("no awaited id in: " .. string.sub(body, 1, 200))
    return
  end
  pending[id] = nil
  if not string.find(body, '"ECHO:s' .. id .. '"', 1, true) then
    mark_bad("id " .. id .. " without its own result: " .. string.sub(body, 1, 200))
  end
end

local threads = {}

function setup(thread)
  table.insert(threads, thread)
end

-- One machine-readable line for the script.
function done(summary, latency, requests)
  local bad_total, reason = 0, ""
  for _, thread in ipairs(threads) do
    bad_total = bad_total + thread:get("bad")
    if reason == "" then
      reason = thread:get("first_bad")
    end
  end
  local errors = summary.errors
  local socket_errors = errors.connect + errors.read + errors.write + errors.timeout
  io.write(string.format(
    "RESULT requests=%d seconds=%.3f rps=%.1f p50_ms=%.3f p99_ms=%.3f bad=%d socket_errors=%d non2xx=%d first_bad=%q\n",
    summary.requests, summary.duration / 1e6, summary.requests / (summary.duration / 1e6),
    latency:percentile(50) / 1000, latency:percentile(99) / 1000,
    bad_total, socket_errors, errors.status, reason))
end
