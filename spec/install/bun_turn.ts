// bun_turn.ts: the Bun package as a user gets it. spec/install/install_test.sh
// copies this file into a fresh project (outside the checkout), runs
// `bun add <the packed tarball>` there, and runs it as the service account:
//   bun bun_turn.ts ROOT IMAGE
// It imports "pi-roundtable-sandbox" by name, starts sandbox() on a fake
// Chat Completions endpoint on 127.0.0.1 (it answers only the host key the
// TypeScript apiKey returns), runs one real sealed turn through the SANDBOX
// service and disposes; then asks sandbox() for an image that does not exist,
// which must refuse to start and name the package's own build command.
// Prints one JSON line; exits 0 when all of that held.
import { libraryPath, sandbox } from "pi-roundtable-sandbox";

const [root, image = "pi-roundtable-sandbox:local"] = process.argv.slice(2);
if (!root?.startsWith("/")) throw new Error("usage: bun bun_turn.ts ROOT [IMAGE]");
const KEY = `bun-package-spec-key-${Math.random().toString(16).slice(2)}`;
let authorized = 0;
const server = Bun.serve({
  hostname: "127.0.0.1",
  port: 0,
  fetch(req) {
    if (req.headers.get("authorization") !== `Bearer ${KEY}`) return new Response("{}", { status: 401 });
    authorized++;
    return Response.json({
      id: "chatcmpl-install",
      object: "chat.completion",
      choices: [{ index: 0, finish_reason: "stop", message: { role: "assistant", content: "the installed package answered" } }],
    });
  },
});
const options = (sub: string, img: string) => ({
  image: img,
  runRoot: `${root}/${sub}/run`,
  workspaceRoot: `${root}/${sub}/ws`,
  stateFile: `${root}/${sub}/state/channels.json`,
  model: "install-model",
  modelUrl: `http://127.0.0.1:${server.port}/v1/chat/completions`,
  allowHttp: true,
  timeZone: "UTC",
  apiKey: () => KEY,
});

const out: Record<string, unknown> = { library: libraryPath() };
try {
  const plugin = await sandbox(options("a", image));
  const r = await plugin.services.SANDBOX.runtime.runTurn("install:bun", { id: "u1", name: "Ada", principalId: "p1" }, "hello");
  await plugin.dispose();
  out.turn = r;
  out.authorized = authorized;
  try {
    await sandbox(options("b", "roundtable-install-test-absent:1"));
    out.missingImage = "started";
  } catch (err) {
    out.missingImage = (err as Error).message;
  }
} finally {
  server.stop(true);
}
console.log(JSON.stringify(out));
const turn = out.turn as { ok?: boolean; text?: string } | undefined;
const good =
  turn?.ok === true &&
  turn.text === "the installed package answered" &&
  authorized > 0 &&
  String(out.library).endsWith("/node_modules/pi-roundtable-sandbox/native/libsbx.so") &&
  String(out.missingImage).includes("roundtable-install-test-absent:1 is missing") &&
  String(out.missingImage).includes("/node_modules/pi-roundtable-sandbox/worker/build-image");
process.exit(good ? 0 : 1);
