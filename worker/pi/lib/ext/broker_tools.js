// broker_tools.js: the host tools the content module describes (spec/rich-mode.md
// 12, 17.4). Each tool posts {input} to /tools/<name> on the broker socket; a
// non-200 answer is "Broker answered <status>", the answer is parsed with a
// 32 MiB limit and ok=false gives its error or "Host tool failed". An image in
// the answer is shown to the model and saved to the outbox as image.png.
// image_generate's reference_images name at most four attachments, each
// read (no-follow, 20 MiB) and sent as base64.
import { join } from "node:path";
import * as broker from "../broker.js";
import { readRegular } from "../files.js";
import { safeName } from "../names.js";
import { log, errorText, cut } from "../log.js";
import { TOOL_ANSWER_MAX, IMAGE_BYTES_MAX, REFERENCE_IMAGES_MAX, REFERENCE_EXT, LOG_ERROR_MAX, TURN_ABORT_MS } from "../limits.js";
import { imageType } from "./read_attachment.js";
import { save } from "../outbox.js";

// referenceImages(workspace, names): the image_generate rule of 17.4.
export function referenceImages(workspace, names) {
  if (!Array.isArray(names)) throw new Error("Invalid attachment name");
  if (names.length > REFERENCE_IMAGES_MAX) throw new Error("At most four references");
  return names.map((name) => {
    if (typeof name !== "string" || !safeName(name)) throw new Error("Invalid attachment name");
    const dot = name.lastIndexOf(".");
    if (dot < 0 || !REFERENCE_EXT.includes(name.slice(dot).toLowerCase())) throw new Error("Not an image attachment");
    let bytes;
    try {
      bytes = readRegular(join(workspace, "attachments", name), IMAGE_BYTES_MAX);
    } catch {
      throw new Error("Not an image attachment");
    }
    return { name, mimeType: imageType(name), data: Buffer.from(bytes).toString("base64") };
  });
}

// onPrivate(privateTo) is told when the answer carries privateTo (14.2
// persistence), before an ok=false answer becomes the thrown error.
export async function callHostTool(name, input, signal, onPrivate = () => {}, outboxDir = undefined) {
  const res = await broker.call("POST", `/tools/${name}`, {
    body: { input }, max: TOOL_ANSWER_MAX, timeoutMs: TURN_ABORT_MS, signal,
  });
  if (res.status !== 200) throw new Error(`Broker answered ${res.status}`);
  const answer = broker.json(res.bytes);
  if (typeof answer?.privateTo === "string" && answer.privateTo.length > 0) onPrivate(answer.privateTo);
  if (!answer || typeof answer !== "object" || answer.ok !== true) {
    throw new Error(typeof answer?.error === "string" && answer.error ? answer.error : "Host tool failed");
  }
  const content = [];
  if (typeof answer.text === "string" && answer.text) content.push({ type: "text", text: answer.text });
  const img = answer.image;
  if (img && typeof img.data === "string" && typeof img.mimeType === "string") {
    content.push({ type: "image", data: img.data, mimeType: img.mimeType });
    // 16.5: a host tool's image is also a reply file, image.png (suffixed when taken).
    if (outboxDir) save(outboxDir, "image", "png", new Uint8Array(Buffer.from(img.data, "base64")));
  }
  if (content.length === 0) content.push({ type: "text", text: "" });
  return { content, details: {} };
}

export function brokerToolsExtension(state, tools) {
  return (pi) => {
    for (const tool of tools) {
      pi.registerTool({
        name: tool.name,
        label: tool.label ?? tool.name,
        description: tool.description ?? "",
        parameters: tool.parameters ?? { type: "object", properties: {} },
        async execute(toolCallId, params, signal) {
          try {
            let input = params ?? {};
            if (tool.name === "image_generate" && input.reference_images !== undefined) {
              input = { ...input, reference_images: referenceImages(state.workspace, input.reference_images) };
            }
            const result = await callHostTool(tool.name, input, signal, (p) => state.privateCalls?.set(toolCallId, p), state.outbox);
            return result;
          } catch (err) {
            log("tool failed", { turnId: state.turn?.turnId, tool: tool.name, error: cut(errorText(err), LOG_ERROR_MAX) });
            throw err;
          }
        },
      });
    }
  };
}
