// examples/rich-content.ts: the content module (spec/rich-mode.md 17.3) of
// examples/bun/rich-host.ts, copied over /app/worker/content.ts in an image
// derived from pi-roundtable-sandbox:pi. It describes the two host tools of
// examples/rich.conf.lua to the worker: `note` (the speaker's private note:
// its result carries privateTo, section 14) and `draw` (an image, which the
// worker saves to the turn's outbox, so the reply carries image.png: 16.5).
export function workerContent(_profile: string) {
  return {
    model: { provider: "claude-bridge", id: "claude-sonnet-4-6" },
    prompt: "You are the example table's helpful assistant. Messages start with the speaker as [name (id)].",
    brokerTools: [
      { name: "clock", description: "The current UTC time", parameters: { type: "object", properties: {} } },
      { name: "note", description: "The speaker's private note", parameters: { type: "object", properties: {} } },
      { name: "draw", description: "Draw a small picture", parameters: { type: "object", properties: { subject: { type: "string" } } } },
    ],
    toolNames: [],
    memoryTools: [],
  };
}
