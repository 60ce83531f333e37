// turn_input.js: the worker-side check of a turn request delivered by
// /worker/next (spec/rich-mode.md 10.1, 16.1, 16.3). Any failure is the one
// message "Invalid turn"; an unknown thinking level is reported by the turn
// runner itself (17.5 step 1), so it is checked there.
import { codePoints, safeName } from "./names.js";
import { ID_MAX, TEXT_MAX, IMAGES_MAX, IMAGE_B64_MAX, IMAGE_BYTES_MAX, IMAGES_TOTAL_MAX, IMAGE_MIME } from "./limits.js";

const B64 = /^[A-Za-z0-9+/]*={0,2}$/;

function fail() { throw new Error("Invalid turn"); }

function decodedLength(b64) {
  const pad = b64.endsWith("==") ? 2 : b64.endsWith("=") ? 1 : 0;
  return (b64.length / 4) * 3 - pad;
}

function isObject(v) { return v !== null && typeof v === "object" && !Array.isArray(v); }

export function validateTurn(t) {
  if (!isObject(t)) fail();
  if (!safeName(t.turnId)) fail();
  const a = t.author;
  if (!isObject(a) || typeof a.id !== "string" || typeof a.name !== "string") fail();
  if (codePoints(a.id) > ID_MAX || codePoints(a.name) > ID_MAX) fail();
  if (a.principalId !== undefined) {
    if (typeof a.principalId !== "string") fail();
    const n = codePoints(a.principalId);
    if (n < 1 || n > ID_MAX) fail();
  }
  if (typeof t.text !== "string" || codePoints(t.text) > TEXT_MAX) fail();
  const memory = t.memory ?? "";
  if (typeof memory !== "string" || codePoints(memory) > TEXT_MAX) fail();
  const visibility = t.memoryVisibility ?? "private";
  if (visibility !== "shared" && visibility !== "private") fail();
  if (typeof t.thinking !== "string") fail();
  const images = t.images ?? [];
  if (!Array.isArray(images) || images.length > IMAGES_MAX) fail();
  let total = 0;
  for (const img of images) {
    if (!isObject(img) || !IMAGE_MIME.includes(img.mimeType) || typeof img.data !== "string") fail();
    if (img.data.length > IMAGE_B64_MAX || img.data.length % 4 !== 0 || !B64.test(img.data)) fail();
    const n = decodedLength(img.data);
    if (n < 1 || n > IMAGE_BYTES_MAX) fail();
    total += n;
    if (total > IMAGES_TOTAL_MAX) fail();
  }
  return {
    turnId: t.turnId,
    author: { id: a.id, name: a.name, ...(a.principalId !== undefined ? { principalId: a.principalId } : {}) },
    text: t.text,
    memory,
    memoryVisibility: visibility,
    images: images.map((i) => ({ data: i.data, mimeType: i.mimeType })),
    thinking: t.thinking,
  };
}
