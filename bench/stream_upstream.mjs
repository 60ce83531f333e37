// stream_upstream.mjs: the loopback upstream of bench/stream_bench.lua: any
// request gets 200 text/event-stream, a body of BYTES bytes of
// Anthropic-shaped SSE events (content_block_delta text deltas), written in
// 64 KiB pieces with chunked framing as fast as the client reads.
//
//   node bench/stream_upstream.mjs BYTES [--parent PID]   prints {"port":N,"pid":P}
import http from "node:http";

const bytes = Number(process.argv[2] ?? 33554432);
const parent = Number(process.argv[process.argv.indexOf("--parent") + 1] || 0);
const event = (i) => `event: content_block_delta\ndata: {"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"token ${i} of a long streamed answer, with some ordinary words in it"}}\n\n`;
let text = "";
for (let i = 0; text.length < bytes; i++) text += event(i);
const body = Buffer.from(text.slice(0, bytes));
const PIECE = 65536;

const server = http.createServer((req, res) => {
  req.resume();
  req.on("end", () => {
    res.writeHead(200, { "content-type": "text/event-stream", "request-id": "req_bench" });
    let at = 0;
    const pump = () => {
      while (at < body.length) {
        const ok = res.write(body.subarray(at, at + PIECE));
        at += PIECE;
        if (!ok) { res.once("drain", pump); return; }
      }
      res.end();
    };
    pump();
  });
});
server.listen(0, "127.0.0.1", () => {
  process.stdout.write(JSON.stringify({ port: server.address().port, pid: process.pid }) + "\n");
});
if (parent) setInterval(() => { try { process.kill(parent, 0); } catch { process.exit(0); } }, 1000);
