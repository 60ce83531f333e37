-- errors.lua: the operator-facing error catalogue of the host Lua (Kong's
-- kong/db/errors.lua pattern; the C side's SBX_FETCH_E_* catalogue is its
-- twin for safe fetch). Each message of spec/runtime.md and spec/broker.md
-- that reaches an operator is written here once, with the fix an operator
-- applies and whether its text is safe to print without SBX_DEBUG.
--
--   local errors = require "sandbox.errors"
--   error(errors.CLEANUP, 0)                 -- raise: the spec's exact string
--   errors.entry(msg)  -> the entry of a raised message, or nil
--   errors.fix(msg, ctx) -> the fix for it (ctx fills in paths), or nil
--   errors.safe_to_show(msg) -> true when msg is a catalogue message whose
--                          text may be printed as is (never a payload)
--
-- An entry is {name, message, fix, safe, prefix, reason}:
--   name     the constant (errors[name] == message)
--   message  the exact text raised with error(msg, 0); `prefix` entries are
--            raised as message .. detail (an option name, an encoder's why)
--   fix      nil, a string, or function(ctx) -> string; ctx = {config=,
--            runRoot=, workspaceRoot=, user=, uid=, gid=} (each optional)
--   safe     false when the text after a prefix may carry data that is not
--            the operator's own (then only SBX_DEBUG shows it); default true
--   reason   the failure reason of spec/operations.md section 1 this error
--            ends a turn with, for the errors that end turns today
--
-- The closed set of turn failure reasons of spec/operations.md 1 lives here
-- too, in M.reasons: each {reason, fix, exit, worker}, where exit is the
-- `sbx run` status of its class (1 the turn failed, 4 the daemon or the
-- image) and worker marks the reasons the worker may report itself. The
-- errors that end a turn name their reason, so `sbx run`, the log lines,
-- the Bun bridge and (later) the metrics read one table:
--
--   errors.reason(name)        -> the reason entry, or nil (not in the set)
--   errors.reason_fix(name, ctx) -> its printed fix (ctx as for fix), or nil
--   errors.exit_status(name)   -> 0 for "ok", else the entry's class status
--   errors.WORKER_REASONS      -> {name = true} of the worker's own reasons
--   errors.EXIT                -> the `sbx run` statuses {ok, turn, usage,
--                                 config, daemon}
--
-- Adding a reason (as hardening.md did: workspace_quota, disk_low,
-- queue_full, host_descriptors, state_write_failed) is one row in
-- M.reasons, plus the place that observes it; every reader (run_turn's
-- result, the turn line, `sbx run`, the Bun bridge) picks it up from here.
-- Modules keep their public constants (runtime.E_CLEANUP, ...) as aliases
-- of these strings; nothing outside this file spells a message.
local M = {}

local function config_of(ctx) return ctx.config or "CONFIG.lua" end

M.catalogue = {
  -- Construction (spec/runtime.md 2.2, 3.1, 3.2)
  { name = "OPTIONS_TABLE", message = "sandbox options must be a table" },
  { name = "UNKNOWN_OPTION", message = "unknown sandbox option: ", prefix = true },
  { name = "LINUX", message = "Docker sandbox execution requires a native Linux host",
    fix = "run sealed turns on a native Linux host with a local Docker daemon" },
  { name = "MODEL", message = "model is required" },
  { name = "API_KEY_TYPE", message = "apiKey must be a function",
    fix = "make apiKey a function, e.g. apiKey = function() return os.getenv(\"MODEL_API_KEY\") end" },
  { name = "MODEL_FALLBACKS", message = "modelFallbacks must be a list of at most 4 {modelUrl, model}",
    fix = 'set modelFallbacks = { { modelUrl = "https://.../v1/chat/completions", model = "..." } } (the same wire format as modelUrl), or leave it out' },
  { name = "UPSTREAM_RETRIES", message = "upstreamRetries must be 0 to 5",
    fix = "set upstreamRetries to a whole number from 0 (never retry) to 5, or leave it out (2)" },
  { name = "BUDGET_TYPE", message = "budget must be a function",
    fix = "make budget a function(scope) that returns false to refuse, or leave it out (examples/daily_budget.lua)" },
  { name = "BUDGET_EXCEEDED", message = "the budget hook refused this turn", reason = "budget_exceeded" },
  { name = "API_KEY_REQUIRED", message = "apiKey is required when no host login is available",
    fix = "add apiKey = function() return os.getenv(\"MODEL_API_KEY\") end to the config and export MODEL_API_KEY" },
  { name = "PROMPT", message = "invalid prompt" },
  { name = "TIME_ZONE", message = "invalid time zone",
    fix = "set TZ to an IANA zone name such as UTC or Europe/London, or unset it" },
  { name = "TIMEOUT", message = "turnTimeoutMs must be 1000 to 600000" },
  { name = "ROOT_PATH", message = "sandbox roots must be absolute dedicated directories",
    fix = function(ctx)
      if ctx.mode == "precheck" then
        return "set runRoot to the absolute path of a directory used only by the precheck runner"
      end
      return "set runRoot and workspaceRoot to absolute paths of directories used only by this package"
    end },
  { name = "ROOT_PRIVATE", message = "sandbox roots must be private directories owned by the service user",
    fix = function(ctx)
      local run, ws = ctx.runRoot or "RUNROOT", ctx.workspaceRoot or "WORKSPACEROOT"
      if ctx.uid == 0 then
        return string.format("run sbx as the service account that owns them, never as root, e.g. "
          .. "`runuser -u sbx -- sbx %s %s`", ctx.command or "run", config_of(ctx))
      end
      if ctx.mode == "precheck" then   -- the runner has runRoot only
        return string.format("chown %s: %s && chmod 700 %s", ctx.user or "USER", run, run)
      end
      return string.format("chown %s: %s %s && chmod 700 %s %s (run `sbx doctor %s` to see which)",
        ctx.user or "USER", run, ws, run, ws, config_of(ctx))
    end },
  { name = "ROOT_SEPARATE", message = "sandbox roots must be separate",
    fix = "use two separate directories for runRoot and workspaceRoot, neither inside the other" },
  { name = "USER", message = "run the host as a non-root user; worker uid/gid must match it",
    fix = function(ctx)
      if ctx.uid == 0 then
        return string.format("run sbx as the service account, never as root, e.g. `runuser -u sbx -- sbx %s %s`",
          ctx.command or "run", config_of(ctx))
      end
      return string.format("remove uid/gid from the config or set uid = %s, gid = %s",
        tostring(ctx.uid or "UID"), tostring(ctx.gid or "GID"))
    end },
  { name = "SOCKET_TOO_LONG", message = "broker socket path too long",
    fix = "choose a runRoot of at most 76 bytes, e.g. /tmp/roundtable-sandbox-run" },
  { name = "REMOTE", message = "remote Docker daemons are unsupported",
    fix = "unset DOCKER_HOST (or set it to unix:///var/run/docker.sock)" },
  { name = "LOCKED", message = "another host process owns these sandbox directories",
    fix = "stop the other process that uses this runRoot (a bot or another sbx), "
      .. "or give this one its own runRoot and workspaceRoot" },
  { name = "HOST_TABLE", message = "sandbox host must be a table" },

  -- Hardening options (shared/spec/hardening.md 1-6)
  { name = "SECCOMP_MISSING", message = "seccomp profile missing: ", prefix = true,
    fix = "restore worker/seccomp.json from the project (it ships with the image's build context), "
      .. "or set seccompProfile to the absolute path of a readable profile" },
  { name = "SECCOMP_INVALID", message = "seccomp profile invalid: ", prefix = true,
    fix = "the file must be a Docker seccomp profile (a JSON object with defaultAction and syscalls); "
      .. "restore worker/seccomp.json from the project" },
  { name = "WORKSPACE_QUOTA_OPTION", message = "workspaceQuotaMb must be 1 to 1048576" },
  { name = "DISK_RESERVE_OPTION", message = "diskReserveMb must be 0 to 1048576" },
  { name = "MAX_QUEUED_OPTION", message = "maxQueuedTurns must be 1 to 1000" },
  { name = "MENTIONS_OPTION", message = 'mentions must be "neutral" or "allow"' },
  { name = "MAX_REPLY_OPTION", message = "maxReplyChars must be 1 to 100000" },
  { name = "NOT_STARTED", message = "sandbox is not started" },

  -- The model route and the operator log (spec/providers.md 1, operations.md 2-3)
  { name = "MODEL_AUTH", message = 'modelAuth must be "bearer", "api-key" or "none"',
    fix = 'set modelAuth = "bearer" (Authorization: Bearer), "api-key" (Azure OpenAI resource keys) or "none" (a local server without a key)' },
  { name = "MAX_OUTPUT_TOKENS", message = "maxOutputTokens must be 1 to 200000",
    fix = "set maxOutputTokens to a whole number from 1 to 200000 (default 4096)" },
  { name = "OUTPUT_FIELD", message = 'outputTokensField must be "max_tokens" or "max_completion_tokens"',
    fix = 'set outputTokensField = "max_tokens" (most providers) or "max_completion_tokens" (OpenAI and Azure reasoning models)' },
  { name = "API_KEY_UNUSED", message = 'apiKey is unused when modelAuth is "none"',
    fix = 'remove apiKey from the config, or set modelAuth = "bearer" / "api-key" if the server needs the key' },
  { name = "LOG_FORMAT", message = 'logFormat must be "text" or "json"' },
  { name = "LOG_LEVEL", message = 'logLevel must be "debug", "info", "warn" or "error"' },
  { name = "AUDIT", message = "audit must be a boolean" },
  { name = "LOGGER", message = "logger must be a table of functions {debug?, info, warn, error}" },
  -- The metrics endpoint (spec/operations.md 4)
  { name = "METRICS_LISTEN", message = "metricsListen must be a loopback address and port",
    fix = 'set metricsListen = "127.0.0.1:9464" (an address of 127.0.0.0/8 or [::1], then a port); '
      .. "to scrape from another host, run a proxy with its own access control on this one" },
  { name = "METRICS_START", message = "metricsListen could not listen: ", prefix = true,
    fix = "another process already listens on that address and port; choose a free port for metricsListen" },

  { name = "WARM_OPTION", message = "invalid warm settings",
    fix = "set warm = { channels = 0..1024, idleMs = 1000..86400000 } (channels = 0 turns warm turns off)" },

  -- The container's arguments (spec/runtime.md 4.2, 4.4)
  { name = "NAME_IMAGE", message = "invalid container name or image" },
  { name = "NON_ROOT", message = "sandbox requires a non-root user and group" },
  { name = "MOUNT_PATH", message = "mount paths must be absolute dedicated directories" },
  { name = "MOUNT_SEPARATE", message = "broker and workspace mounts must be separate" },
  { name = "LIMITS", message = "invalid resource limits" },
  { name = "LABELS", message = "invalid container labels" },
  { name = "ENTRYPOINT", message = "invalid entrypoint",
    fix = "give entrypoint as a list of absolute paths and arguments, none empty or starting with '-'" },
  -- The container runtime (shared/spec/warm-turns.md 2, 4)
  { name = "RUNTIME", message = "invalid container runtime",
    fix = 'set runtime to the name of a runtime the Docker daemon has registered (lowercase letters, digits, '
      .. '"_", "." or "-", at most 64 characters), e.g. runtime = "runsc" for gVisor, or remove it for the '
      .. "daemon's default" },
  { name = "RUNTIME_UNREGISTERED", message = "container runtime not registered with the Docker daemon: ",
    prefix = true,
    fix = function(ctx)
      local name = ctx.runtime or "NAME"
      if name == "runsc" then
        return "as root: make deps RUNSC=1 (installs Debian's runsc, registers it in /etc/docker/daemon.json "
          .. "and reloads the daemon)"
      end
      return string.format('register it in /etc/docker/daemon.json ("runtimes": {"%s": {"path": "/usr/bin/%s"}}) '
        .. "and reload the daemon (as root: kill -HUP $(pidof dockerd)), or remove runtime from the config",
        name, name)
    end },

  -- Broker configuration (spec/broker.md 4)
  { name = "BROKER_OPTIONS", message = "broker options must be a table" },
  { name = "BUDGET", message = "invalid broker call or output-token budget" },
  { name = "TOOL", message = "invalid or duplicate host tool" },
  { name = "MCP", message = "invalid or duplicate MCP server/tool" },
  { name = "URL_INVALID", message = "invalid broker endpoint URL" },
  { name = "URL_UNSAFE", message = "broker endpoints must be credential-free HTTPS URLs" },

  -- One turn (spec/runtime.md 5.2-5.5, 4.8)
  { name = "BUSY", message = "sandbox is stopped or channel is busy",
    fix = "wait for the channel's running turn to finish" },
  { name = "CHANNEL", message = "invalid sandbox channel",
    fix = "use a channel key like discord:1234 (^[a-z][a-z0-9_-]*:.+, at most 256 characters)" },
  { name = "PRINCIPAL", message = "a sandbox turn needs the principal its speaker was admitted as" },
  { name = "MESSAGE", message = "invalid sandbox message", fix = "give a non-empty speaker ID and valid UTF-8 text" },
  { name = "TOO_LARGE", message = "sandbox message too large",
    fix = "keep the message within 32000 characters and speaker fields within 256" },
  { name = "WORKSPACE", message = "sandbox workspace must be a service-owned directory" },
  { name = "RUN_DIR", message = "sandbox run directory could not be created" },
  { name = "BROKER_START", message = "sandbox broker could not start" },
  { name = "TURN_ENCODING", message = "invalid sandbox turn: ", prefix = true, safe = false },
  { name = "TIMED_OUT", message = "sandbox turn timed out", reason = "deadline",
    fix = "raise turnTimeoutMs in the config (or --timeout) if turns need longer" },
  { name = "STOPPED", message = "sandbox turn stopped", reason = "stopped" },
  { name = "BODY_TOO_LARGE", message = "body too large", reason = "invalid_reply" },
  { name = "WORKER", message = "sandbox worker failed", reason = "worker_failed" },
  { name = "WORKER_OOM", message = "sandbox worker was killed for memory", reason = "worker_oom" },
  { name = "IMAGE_MISSING", message = "sandbox image is missing", reason = "image_missing" },
  { name = "DAEMON", message = "the Docker daemon did not answer", reason = "daemon_unavailable" },
  { name = "REPLY", message = "invalid sandbox reply", reason = "invalid_reply" },
  { name = "CLEANUP", message = "sandbox container cleanup failed; inspect this installation's containers",
    reason = "cleanup_failed" },

  -- A hostile guest's channel (shared/spec/hardening.md 2-4): the fixes
  -- are their reasons' (M.reasons)
  { name = "WORKSPACE_QUOTA", message = "sandbox workspace is over its quota", reason = "workspace_quota" },
  { name = "DISK_LOW", message = "sandbox disk space is below diskReserveMb", reason = "disk_low" },
  { name = "QUEUE_FULL", message = "sandbox channel queue is full", reason = "queue_full" },
  { name = "HOST_DESCRIPTORS", message = "sandbox host is out of file descriptors", reason = "host_descriptors" },

  -- The precheck script runner (spec/precheck.md 2.1, 2.2, 4); it also
  -- raises LINUX, ROOT_PATH, ROOT_PRIVATE, USER, SOCKET_TOO_LONG, NAME_IMAGE,
  -- ENTRYPOINT, LIMITS, MOUNT_PATH, BODY_TOO_LARGE, WORKER and CLEANUP.
  { name = "PRECHECK_OPTIONS", message = "precheck options must be a table" },
  { name = "PRECHECK_UNKNOWN_OPTION", message = "unknown precheck option: ", prefix = true },
  { name = "PRECHECK_BUDGET", message = "invalid precheck MCP call budget",
    fix = "set maxCalls to a whole number from 1 to 100 (default 16)" },
  { name = "PRECHECK_TIMEOUT", message = "precheck timeoutMs must be 1000 to 600000" },
  { name = "PRECHECK_GRANT_FN", message = "precheck grant must be a function",
    fix = "give grant = function(scope) return { {name=, url=, tools={...}, token=fn} } end" },
  { name = "PRECHECK_TOOL_NAME_FN", message = "precheck toolName must be a function" },
  { name = "PRECHECK_TOOL_NAME_RESULT", message = "precheck toolName must return a non-empty string" },
  { name = "PRECHECK_TOOL_NAME_YIELD", message = "precheck toolName must not yield",
    fix = "answer toolName from what it is given; it runs synchronously" },
  { name = "PRECHECK_DRIVER", message = "precheck driver must have an exec function" },
  { name = "PRECHECK_FETCH", message = "precheck fetchImpl must be a function" },
  { name = "PRECHECK_GRANT", message = "invalid precheck MCP grant",
    fix = "make grant return a list (possibly empty) of server tables {name=, url=, tools={...}, token=fn}" },
  { name = "PRECHECK_SERVER_NAME", message = "invalid or repeated precheck MCP server name",
    fix = "name each granted server once, with 1-100 of A-Z a-z 0-9 _ -" },
  { name = "PRECHECK_ENDPOINT", message = "invalid precheck MCP endpoint" },
  { name = "PRECHECK_HTTPS", message = "precheck MCP endpoints must be credential-free HTTPS",
    fix = "use an https:// URL without user, password or #fragment (http only with allowHttpMcp); put the token in token()" },
  { name = "PRECHECK_TOOLS", message = "invalid precheck MCP tool list",
    fix = "list each tool once, with 1-128 of A-Z a-z 0-9 _ . -" },
  { name = "PRECHECK_TOKEN", message = "precheck MCP token must be a function" },
  { name = "PRECHECK_CONTEXT", message = "invalid precheck context" },
  { name = "PRECHECK_SCRIPT", message = "invalid precheck script" },
  { name = "PRECHECK_TOO_LARGE", message = "precheck script too large" },
  { name = "PRECHECK_RUN_DIR", message = "precheck run directories could not be created" },
  { name = "PRECHECK_TIMED_OUT", message = "precheck script timed out",
    fix = "raise timeoutMs (the runner's backstop) and the core's precheck deadline if scripts need longer" },
  { name = "PRECHECK_UNREADABLE", message = "the precheck worker answered nothing it could read" },
  { name = "PRECHECK_SCRIPT_FAILED", message = "the script failed" },

  -- Channel state (spec/runtime.md 3.2-3.3, 7.1)
  { name = "STATE_INVALID", message = "invalid sandbox channel state",
    fix = "the file must be a JSON array of channel keys such as "
      .. '["discord:123456789"]; restore it from a backup or remove it to start from initialChannels' },
  { name = "STATE_SAVE", message = "routing state could not be saved", reason = "state_write_failed" },
  { name = "STATE_DIR", message = "routing state directory must be private and service-owned",
    fix = "chown the directory to the service user and chmod it 0700" },
  { name = "STATE_FILE", message = "routing state must be a service-owned regular file",
    fix = "replace it with a regular file owned by the service user (no symbolic link)" },
  { name = "STATE_ABSOLUTE", message = "stateFile must be absolute" },
  { name = "STATE_NAME", message = "stateFile must name a file" },
  { name = "STATE_MOUNTS", message = "routing state must stay outside sandbox mounts" },

  -- The scoped delegator (spec/fetch-and-delegation.md 3): construction,
  -- then start()'s refusals (DelegationError messages) and its log line
  { name = "DELEGATION_BUDGET", message = "Invalid delegation target/budget",
    fix = "give target (a non-empty name), timeoutMs 1000..1200000 and a whole maxConcurrent >= 1" },
  { name = "DELEGATION_TITLE_LIMIT", message = "Invalid delegation title limit",
    fix = "maxTitleChars must be a whole number >= 1 (default 200)" },
  { name = "DELEGATION_REPORT_LIMIT", message = "Invalid delegation maxReportChars",
    fix = "maxReportChars must be a whole number >= 1 (default 80000)" },
  { name = "DELEGATION_DIAGNOSTIC_LIMIT", message = "Invalid delegation diagnosticChars",
    fix = "diagnosticChars must be a whole number >= 1 (default 600)" },
  { name = "DELEGATION_CALLBACKS", message = "Invalid delegation callbacks",
    fix = "give run = function(request, ctx) and deliver = function(report, ctx)" },
  { name = "DELEGATION_SCOPE", message = "Delegation scope refused" },
  { name = "DELEGATION_UTF8", message = "title and task must be valid UTF-8" },
  { name = "DELEGATION_REQUIRED", message = "title and task are required" },
  { name = "DELEGATION_REPORT_TOO_LARGE", message = "Research report too large" },
  { name = "DELEGATION_REPORT_UTF8", message = "Research report is not valid UTF-8" },
  { name = "DELEGATION_DELIVER_FAILED", message = "Sandbox task report failed",
    fix = "the host's deliver callback raised; the report was not delivered (see the host's own log)" },
  -- The research worker (fetch-and-delegation.md 4): construction
  { name = "RESEARCH_NEEDS_FETCH", message = "Research needs tools, fetchContent or extractFetched",
    fix = "give the research worker its own tools, or fetchContent / extractFetched" },
  { name = "RESEARCH_NEEDS_SEARCH", message = "Research needs search unless it has its own tools",
    fix = "give search = function(query, ctx), or the worker's own tools" },
  { name = "RESEARCH_OPTION", message = "Invalid research option ", prefix = true },
  -- scrub_diagnostic (fetch-and-delegation.md 2)
  { name = "DIAGNOSTIC_LIMIT", message = "Invalid diagnostic limit",
    fix = "max must be nil, a whole number >= 1 or math.huge" },
  -- The owner commands (runtime.md 9): the operator line of a command that raised
  { name = "COMMAND_FAILED", message = "owner command failed" },
  -- The embedding ABI (core/API.md, embed/): a host's malformed request or
  -- options, a config that does not load
  { name = "EMBED_REQUEST", message = "invalid request: ", prefix = true,
    fix = "the host sent a request the engine's ABI does not take (core/API.md); fix the host" },
  { name = "EMBED_OPTIONS", message = "invalid options_json: ", prefix = true,
    fix = "pass sbx_engine_new a JSON object with the documented members (core/API.md)" },
  { name = "CONFIG_LOAD", message = "cannot load config: ", prefix = true, safe = false },

  -- Rich mode: construction (spec/rich-mode.md 3)
  { name = "RICH_OPTIONS", message = "Pi sandbox options must be a table" },
  { name = "RICH_OPTION", message = "Invalid Pi sandbox option: ", prefix = true },
  { name = "RICH_PARTY_DIR", message = "Dedicated absolute state directory required",
    fix = "set partyDir to an absolute path (not /) of a directory used only by rich mode" },
  { name = "RICH_LINUX", message = "Pi sandbox requires native Linux and local Docker",
    fix = "run rich mode on a native Linux host with a local Docker daemon, or pass a driver" },
  { name = "RICH_NON_ROOT", message = "Pi sandbox host must be non-root",
    fix = "run the host as the service account, e.g. `runuser -u sbx -- ...`" },
  { name = "RICH_PREFIX", message = "Invalid container prefix",
    fix = "containerPrefix must match ^[a-z0-9][a-z0-9-]{0,40}$" },
  { name = "RICH_DEADLINE", message = "Invalid runtime deadline",
    fix = "turnTimeoutMs and startTimeoutMs must be whole milliseconds from 1000 to 600000" },
  { name = "RICH_COMPACTOR_TIME", message = "The compactor's timeout must leave half the turn",
    fix = "lower compaction.timeoutMs to at most half of turnTimeoutMs (or raise turnTimeoutMs)" },
  { name = "RICH_ENDPOINT", message = "Invalid trusted endpoint",
    fix = "upstream and MCP URLs must be https:// (MCP http:// only with allowHttpMcp) "
      .. "without userinfo, query or fragment" },
  { name = "RICH_MCP_NAME", message = "Invalid MCP server name",
    fix = "MCP server names must match ^[a-zA-Z0-9_-]{1,100}$ and be unique" },
  { name = "RICH_TOOL_NAME", message = "Invalid host tool name",
    fix = "tools.names entries must match ^[a-zA-Z0-9_-]{1,128}$ and be unique" },
  { name = "RICH_BUDGET", message = "Invalid broker budget", fix = "maxCalls must be a whole number from 1 to 1000" },
  { name = "RICH_OUTPUT", message = "Invalid output-token budget",
    fix = "maxOutputTokens must be a whole number from 1025 to 200000" },
  { name = "RICH_COMPACTOR", message = "Invalid compactor",
    fix = "compaction = {engine = \"name\", compact = function(request, ctx) ... end, "
      .. "timeoutMs = 1000..600000, maxRequestBytes = 1..100663296}" },
  { name = "RICH_TIME_ZONE", message = "Invalid time zone",
    fix = "set timeZone to an IANA zone name of the host's database, such as UTC or Europe/Berlin" },
  { name = "RICH_PRIVATE", message = "State directory must be private and host-owned",
    fix = function(ctx)
      local dir = ctx.partyDir or "PARTYDIR"
      return string.format("chown %s: %s && chmod 700 %s", ctx.user or "USER", dir, dir)
    end },

  -- Rich mode: channel directories and the alias guard (4, 6)
  { name = "RICH_CHANNEL", message = "Invalid channel key", fix = "use a non-empty UTF-8 channel key" },
  { name = "RICH_CHANNEL_LONG", message = "Channel key too long" },
  { name = "RICH_ROOT_LINK", message = "Channel root symlink refused",
    fix = "replace the symbolic link at the channel's directory under partyDir with nothing; rich mode creates it" },
  { name = "RICH_ALIAS", message = "Channel workspace alias refused",
    fix = "two channel keys map to one directory name; keep using the key recorded in its .channel-key" },
  { name = "RICH_SOCKET", message = "Broker socket path too long",
    fix = "choose a shorter partyDir: partyDir/<channel>/run/broker.sock must fit in 100 bytes" },
  { name = "RICH_DIR_LINK", message = "Channel directory symlinks refused" },

  -- Rich mode: the container driver (5.2, 5.4)
  { name = "RICH_SPEC", message = "Invalid container specification" },
  { name = "RICH_WORKER_ROOT", message = "Worker must be non-root" },
  { name = "RICH_MOUNT", message = "Invalid mount path" },
  { name = "RICH_LOG_DRIVER", message = "Invalid container log driver",
    fix = "log = {driver = \"local\", options = {[\"max-size\"] = \"10m\"}}: names match ^[a-z0-9][a-z0-9_.-]{0,63}$" },
  { name = "RICH_DOCKER", message = "docker ", prefix = true, safe = false },

  -- Rich mode: lifecycle and turns (6, 7, 16)
  { name = "RICH_PROFILE", message = "Unknown profile" },
  { name = "RICH_MCP_MISSING", message = "MCP server ", prefix = true },
  { name = "RICH_CANCELLED", message = "Operation cancelled" },
  { name = "RICH_NOT_READY", message = "Worker did not become ready",
    fix = "check the worker's log (`docker logs <containerPrefix>-<channel>`) and raise startTimeoutMs if it is slow" },
  { name = "RICH_BUSY", message = "Channel is busy" },
  { name = "RICH_TURN_INPUT", message = "Invalid turn input" },
  { name = "RICH_EFFORT", message = "Invalid effort level" },
  { name = "RICH_MEMORY", message = "Memory context too large" },
  { name = "RICH_NO_BROKER", message = "Broker unavailable" },
  { name = "RICH_WORKER_FAILED", message = "Worker turn failed: ", prefix = true, safe = false },
  { name = "RICH_TIMED_OUT", message = "Sandbox turn timed out", reason = "deadline",
    fix = "raise turnTimeoutMs if turns need longer" },
  { name = "RICH_TURN_FAILED", message = "Sandbox turn failed: ", prefix = true, safe = false },
  { name = "RICH_IMAGES", message = "Too many images" },
  { name = "RICH_IMAGE", message = "Invalid or oversized image" },
  { name = "RICH_IMAGE_BUDGET", message = "Image budget exceeded" },
  { name = "RICH_FILES", message = "Too many reply files" },
  { name = "RICH_FILE", message = "Invalid reply file" },
  { name = "RICH_FILE_BUDGET", message = "Reply file budget exceeded" },

  -- Rich mode: the broker (9-14)
  { name = "RICH_BOUND", message = "Broker turn already active" },
  { name = "RICH_WORKER_BUSY", message = "Worker is busy" },
  { name = "RICH_TURN_CANCELLED", message = "Turn cancelled" },
  { name = "RICH_CREDENTIAL", message = "Credential unavailable",
    fix = "oauthToken (or mcp.token) returned nothing: refresh the host's login" },
  { name = "RICH_REFLECTED", message = "Credential reflected" },
  { name = "RICH_TOO_LARGE", message = "Response too large" },
  { name = "RICH_TOOL_OUTPUT", message = "Invalid tool output" },
  { name = "RICH_REBUILD", message = "Sandbox worker image ", prefix = true,
    fix = "rebuild the worker image with `make image-pi` from the installed core and sandbox packages" },

  -- The PostgreSQL adapter (lua/sandbox/adapters/postgres.lua, issue 24 item 4)
  { name = "PG_DRIVER", message = "the PostgreSQL adapter needs Lua 5.4's DBI driver for PostgreSQL",
    fix = "apt-get install lua-dbi-postgresql (or make deps)" },
  { name = "PG_OPTIONS", message = "postgres adapter: ", prefix = true },
  { name = "PG_CONNECT", message = "PostgreSQL connection failed: ", prefix = true, safe = false,
    fix = "check host (a host name or the server's socket directory), port, dbname, user and password, and that the server runs" },
  { name = "PG_MIGRATE", message = "PostgreSQL migration failed; nothing of it was applied",
    fix = "the server's log names the statement; the adapter's user needs CREATE on the database's schema" },
  { name = "PG_QUERY", message = "PostgreSQL query failed",
    fix = "the server's log names the cause (statement_timeout, a dropped connection, permissions)" },
  { name = "PG_IDENTITY", message = "PostgreSQL notes need a bound channel and speaker",
    fix = "call the adapter's tools and memory only from a turn the host bound (ctx.channel, ctx.speaker; privateTo needs a principalId)" },
}

local function image_of(ctx) return ctx.image or "pi-roundtable-sandbox:local" end

-- The `sbx run` exit statuses (spec/operations.md 1).
M.EXIT = { ok = 0, turn = 1, usage = 2, config = 3, daemon = 4 }

-- The closed set of turn reasons (spec/operations.md 1), in the table's order.
M.reasons = {
  { reason = "ok" },
  { reason = "upstream_status",
    fix = "the provider refused the model call; compare its status and code with the provider's API reference" },
  { reason = "upstream_unreachable", fix = "check modelUrl / the network from this host" },
  { reason = "upstream_timeout", fix = "the provider is slow; check its status" },
  { reason = "upstream_invalid", fix = "check modelUrl points at a Chat Completions endpoint" },
  { reason = "reflection",
    fix = 'the upstream echoed the credential; if it is not a secret (a local server\'s placeholder), use modelAuth = "none"' },
  { reason = "credential_missing", fix = "apiKey returned no credential for this channel/speaker" },
  { reason = "credential_error", fix = "the hook raised; see the preceding log line" },
  { reason = "budget_exhausted", fix = "a guest or model loop spent the turn's broker calls" },
  { reason = "budget_exceeded",
    fix = "the budget hook refused this channel or speaker (its limit is spent, or it raised: see the preceding "
      .. "log line); raise the limit or wait for its period to end" },
  { reason = "tool_failed" },
  { reason = "model_no_text", worker = true,
    fix = "the model's reply held no text; check model, and raise maxOutputTokens for a reasoning model" },
  { reason = "model_filtered", worker = true,
    fix = "the provider's content filter withheld the reply to this message" },
  { reason = "context_budget", worker = true,
    fix = "the channel's notes, history and tool descriptions do not fit one model request; "
      .. "shorten the tool descriptions or start the channel fresh" },
  { reason = "invalid_turn", worker = true,
    fix = function(ctx)
      return "the image does not read this engine's turns; rebuild it with `make image` (image "
        .. image_of(ctx) .. ")"
    end },
  { reason = "memory_store", worker = true,
    fix = "the channel's memory.json was invalid (a compromised turn, or hand editing): the worker kept it as "
      .. "memory.json.invalid-<time> in the channel's workspace and went on with an empty store; "
      .. "if the turn failed, it could not move it aside: inspect the workspace" },
  { reason = "history", worker = true,
    fix = "the channel's history.json was invalid (kept as history.json.invalid-<time>, the turn went on "
      .. "with an empty history) or could not be written; start the channel fresh" },
  { reason = "worker_failed",
    fix = function(ctx) return string.format("check the image with `sbx doctor %s`", config_of(ctx)) end },
  { reason = "worker_oom", fix = "raise limits.memoryMb or look for a memory bomb in this channel" },
  { reason = "invalid_reply", fix = "the image is not this engine's worker, or it was tampered with" },
  { reason = "deadline", fix = "raise turnTimeoutMs (or --timeout) or check slow tools" },
  { reason = "stopped" },
  { reason = "cleanup_failed",
    fix = function(ctx)
      return string.format("inspect this installation's containers; `sbx cleanup %s --force`", config_of(ctx))
    end },
  { reason = "daemon_unavailable", exit = M.EXIT.daemon,
    fix = function(ctx)
      if ctx.docker_host and ctx.docker_host ~= "" then
        return string.format("DOCKER_HOST=%s does not answer: start the daemon on that socket or fix "
          .. "DOCKER_HOST; `sbx doctor %s`", ctx.docker_host, config_of(ctx))
      end
      return string.format("start dockerd (as root: make deps) or set DOCKER_HOST; `sbx doctor %s`", config_of(ctx))
    end },
  { reason = "workspace_quota",
    fix = function(ctx)
      return string.format("an operator must free space in this channel's workspace%s (or raise workspaceQuotaMb); "
        .. "the channel's turns are refused until it is under the quota",
        ctx.workspace and (" " .. ctx.workspace) or (ctx.workspaceRoot and (" under " .. ctx.workspaceRoot) or ""))
    end },
  { reason = "disk_low",
    fix = "an operator must free space on the filesystem of workspaceRoot/runRoot (every channel's turns are "
      .. "refused until free space is above diskReserveMb), and should give each workspace a filesystem quota" },
  { reason = "queue_full",
    fix = "a guest is flooding the channel; raise maxQueuedTurns only if the channel is really this busy" },
  { reason = "host_descriptors",
    fix = "raise the service's hard descriptor limit (LimitNOFILE= / ulimit -Hn) or run fewer channels at once" },
  { reason = "state_write_failed",
    fix = "the state file was left as it was; free space on (or fix) the state directory's filesystem and retry" },
  -- a precheck run's own (spec/precheck.md 4; `modes` names the modes a
  -- reason belongs to when it is not a sealed or rich turn's)
  { reason = "script_error", modes = { precheck = true } },
  { reason = "run_dir", modes = { precheck = true },
    fix = "check that runRoot is writable by the service account and its filesystem has free space" },
  { reason = "image_missing", exit = M.EXIT.daemon,
    fix = function(ctx)
      -- this tree's own build command (a checkout's make image, an installed
      -- tree's build-image): sandbox/runtime/layout.lua
      return "build it: " .. require("sandbox.runtime.layout").image_fix(image_of(ctx))
    end },
}

-- The reasons a precheck run ends with (spec/precheck.md 4, operations.md
-- 3 "precheck finished"), a subset of M.reasons plus its own two.
M.PRECHECK_REASONS = { "ok", "script_error", "deadline", "stopped", "invalid_reply", "run_dir",
  "cleanup_failed", "daemon_unavailable", "image_missing", "worker_failed" }

local by_reason = {}
M.WORKER_REASONS = {}
for _, r in ipairs(M.reasons) do
  assert(by_reason[r.reason] == nil, r.reason)
  r.exit = r.exit or (r.reason == "ok" and M.EXIT.ok or M.EXIT.turn)
  by_reason[r.reason] = r
  if r.worker then M.WORKER_REASONS[r.reason] = true end
end

function M.reason(name)
  return type(name) == "string" and by_reason[name] or nil
end

function M.reason_fix(name, ctx)
  local r = M.reason(name)
  if r == nil or r.fix == nil then return nil end
  if type(r.fix) == "function" then return r.fix(ctx or {}) end
  return r.fix
end

function M.exit_status(name)
  local r = M.reason(name)
  return r and r.exit or M.EXIT.turn
end

local by_message, prefixes = {}, {}
for _, e in ipairs(M.catalogue) do
  assert(M[e.name] == nil and by_message[e.message] == nil, e.name)
  if e.safe == nil then e.safe = true end
  M[e.name] = e.message
  by_message[e.message] = e
  if e.prefix then prefixes[#prefixes + 1] = e end
end

-- The entry of a raised message: an exact message, or message .. detail
-- for a prefix entry. nil for anything else (a Lua error, a driver's own
-- text, a payload).
function M.entry(msg)
  if type(msg) ~= "string" then return nil end
  local e = by_message[msg]
  if e and not e.prefix then return e end
  for _, p in ipairs(prefixes) do
    if msg:sub(1, #p.message) == p.message then return p end
  end
  return nil
end

-- The fix of a raised message: its own, else its turn reason's.
function M.fix(msg, ctx)
  local e = M.entry(msg)
  if e == nil then return nil end
  if e.fix == nil then return e.reason and M.reason_fix(e.reason, ctx) or nil end
  if type(e.fix) == "function" then return e.fix(ctx or {}) end
  return e.fix
end

function M.safe_to_show(msg)
  local e = M.entry(msg)
  return e ~= nil and e.safe
end

return M
