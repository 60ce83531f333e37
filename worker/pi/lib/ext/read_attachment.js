// read_attachment.js: the read_attachment tool (spec/rich-mode.md 17.4). It
// reads one regular file directly inside <workspace>/attachments, named by a
// safe basename and opened without following links; images come back as
// image content, anything else as text cut at 40,000 characters.
import { join } from "node:path";
import { Type } from "typebox";
import { readRegular, FileRefused } from "../files.js";
import { safeName } from "../names.js";
import { IMAGE_BYTES_MAX, ATTACHMENT_TEXT_MAX } from "../limits.js";

const IMAGE_TYPES = { ".png": "image/png", ".jpg": "image/jpeg", ".jpeg": "image/jpeg", ".webp": "image/webp", ".gif": "image/gif" };

export function imageType(name) {
  const dot = name.lastIndexOf(".");
  return dot < 0 ? undefined : IMAGE_TYPES[name.slice(dot).toLowerCase()];
}

export function readAttachmentExtension(state) {
  return (pi) => {
    pi.registerTool({
      name: "read_attachment",
      label: "Read attachment",
      description: "Read a file the speaker attached to this conversation, by its name in the attachments folder.",
      parameters: Type.Object({ name: Type.String({ description: "The attachment's file name" }) }),
      async execute(_id, params) {
        const name = params.name;
        if (!safeName(name)) throw new Error("Invalid attachment name");
        let bytes;
        try {
          bytes = readRegular(join(state.workspace, "attachments", name), IMAGE_BYTES_MAX);
        } catch (err) {
          if (err instanceof FileRefused && err.reason === "too-large") throw new Error("Attachment too large");
          throw new Error(`there is no attachment named ${name}`);
        }
        const mime = imageType(name);
        if (mime) {
          return { content: [{ type: "image", data: Buffer.from(bytes).toString("base64"), mimeType: mime }], details: {} };
        }
        let text = new TextDecoder().decode(bytes);
        if (text.length > ATTACHMENT_TEXT_MAX) text = `${text.slice(0, ATTACHMENT_TEXT_MAX)}\n\n[truncated at ${ATTACHMENT_TEXT_MAX} characters]`;
        return { content: [{ type: "text", text }], details: {} };
      },
    });
  };
}
