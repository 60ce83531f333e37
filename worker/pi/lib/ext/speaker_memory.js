// speaker_memory.js: appends the turn's memory block to the system prompt
// after a blank line on each run (spec/rich-mode.md 17.4). The block is the
// host's memory.promptBlock for the admitted speaker, delivered in the turn.
export function speakerMemoryExtension(state) {
  return (pi) => {
    pi.on("before_agent_start", (event) => {
      const memory = state.turn?.memory ?? "";
      return memory ? { systemPrompt: `${event.systemPrompt}\n\n${memory}` } : undefined;
    });
  };
}
