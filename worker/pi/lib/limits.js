// limits.js: every bound the rich worker enforces, in one place (spec/rich-mode.md
// sections 10.7, 16.3, 17 and 20). Other modules import these names; none
// repeats a number.
export const MiB = 1024 * 1024;

export const FORWARD_BODY_MAX = 96 * MiB;        // 17.2 forwarder request buffer
export const TURN_BODY_MAX = 96 * MiB;           // 10.7 step 3: /worker/next body
export const TOOL_ANSWER_MAX = 32 * MiB;         // 17.4 broker tool answer
export const SMALL_ANSWER_MAX = 1 * MiB;         // /mcp-tools, /worker/config, plain answers

export const READY_TIMEOUT_MS = 5_000;           // 10.7 step 3
export const NEXT_TIMEOUT_MS = 55_000;
export const RESULT_TIMEOUT_MS = 60_000;
export const RETRY_SLEEP_MS = 250;
export const STARTUP_CALL_TIMEOUT_MS = 15_000;   // GET /mcp-tools, GET /worker/config
export const TURN_ABORT_MS = 10 * 60_000;        // 17.5 step 5: in-worker abort timer

export const MCP_WAIT_MS = 45_000;               // 17.4: MCP tools get 45 s to appear
export const MCP_POLL_MS = 250;

export const TEXT_MAX = 100_000;                 // 16.3: text, memory, final text (code points)
export const ID_MAX = 256;                       // author id/name, principalId
export const LOG_ERROR_MAX = 2_000;              // "tool failed" error field
export const RESULT_ERROR_MAX = 10_000;          // 10.5 step 5: ok=false error

export const IMAGES_MAX = 8;                     // 16.1
export const IMAGE_B64_MAX = 27_962_028;
export const IMAGE_BYTES_MAX = 20 * MiB;
export const IMAGES_TOTAL_MAX = 64 * MiB;
export const IMAGE_MIME = ["image/png", "image/jpeg", "image/webp", "image/gif"];

export const SKILL_FILE_MAX = 256 * 1024;        // 17.4 read_skill
export const SKILL_OUTPUT_MAX = 40_000;
export const ATTACHMENT_TEXT_MAX = 40_000;       // read_attachment text output (same cut as skills)
export const REFERENCE_IMAGES_MAX = 4;           // 17.4 image_generate
export const REFERENCE_EXT = [".png", ".jpg", ".jpeg", ".webp", ".gif"];

export const THINKING_LEVELS = ["low", "medium", "high", "xhigh"];

export const OUTBOX_FILES_MAX = 10;              // 16.5 worker outbox
export const OUTBOX_FILE_MAX = 10 * MiB;
export const OUTBOX_TOTAL_MAX = 50 * MiB;

export const COMPACTION_ANSWER_MAX = 32 * MiB;   // 15.2: the host's /compaction/compact answer
export const REPORT_TIMEOUT_MS = 5_000;          // 15.2: each /compaction/report
