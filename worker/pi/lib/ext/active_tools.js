// active_tools.js: loaded last (spec/rich-mode.md 17.4). It keeps the Pi
// extension API so the worker can pin exactly the declared tools before every
// turn, whatever earlier extensions (the bridge's AskClaude, the MCP proxy
// tool) registered or activated.
export function activeToolsExtension(state) {
  return (pi) => {
    state.allToolNames = () => pi.getAllTools().map((t) => t.name);
    state.pinTools = () => pi.setActiveTools(state.activeTools);
  };
}
