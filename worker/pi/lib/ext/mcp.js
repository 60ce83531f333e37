// mcp.js: the MCP adapter for profiles with servers (spec/rich-mode.md 13,
// 17.4). pi-mcp-adapter gets an isolated in-memory config (no config file is
// read): one eager HTTP server per broker server at
// http://127.0.0.1:<forwarder port>/mcp/<name>, registering exactly the
// tools GET /mcp-tools named as direct tools. The broker adds the credential;
// the adapter sends none.
import { createMcpAdapter } from "pi-mcp-adapter";
import { formatToolName } from "pi-mcp-adapter/types";

export function mcpToolNames(servers) {
  const names = [];
  for (const s of servers) for (const t of s.tools) names.push(formatToolName(t, s.name, "server"));
  return names;
}

export function mcpExtension(servers, port) {
  const mcpServers = {};
  for (const s of servers) {
    mcpServers[s.name] = {
      url: `http://127.0.0.1:${port}/mcp/${s.name}`,
      lifecycle: "eager",
      directTools: [...s.tools],
      toolPrefix: "server",
    };
  }
  return createMcpAdapter({ config: { mcpServers, settings: { toolPrefix: "server", disableProxyTool: true } } });
}
