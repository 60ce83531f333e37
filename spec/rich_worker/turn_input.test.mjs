// turn_input.test.mjs: the worker-side turn check of spec/rich-mode.md 16.3
// (error "Invalid turn"), and the image_generate reference rule of 17.4.
import { describe, test, expect, afterAll } from "bun:test";
import { mkdtempSync, mkdirSync, writeFileSync, symlinkSync, rmSync } from "node:fs";
import { join } from "node:path";
import { tmpdir } from "node:os";
import { validateTurn } from "../../worker/pi/lib/turn_input.js";
import { referenceImages } from "../../worker/pi/lib/ext/broker_tools.js";
import { turn } from "./harness.mjs";

const refused = (over) => expect(() => validateTurn(turn(over))).toThrow("Invalid turn");

describe("turn check (16.3)", () => {
  test("a well-formed turn passes with its fields", () => {
    const t = validateTurn(turn({ images: [{ data: "iVBORw0KGgo=", mimeType: "image/png" }], memoryVisibility: "shared" }));
    expect(t.author).toEqual({ id: "123", name: "Ann", principalId: "ann" });
    expect(t.images).toHaveLength(1);
    expect(t.memoryVisibility).toBe("shared");
  });
  test("unsafe turn ids are refused", () => { for (const id of ["", ".", "..", "a/b", "a\\b", "a\nb", "x".repeat(256)]) refused({ turnId: id }); });
  test("author id or name over 256 characters, an empty principalId are refused", () => {
    refused({ author: { id: "x".repeat(257), name: "A" } });
    refused({ author: { id: "1", name: "é".repeat(257) } });
    refused({ author: { id: "1", name: "A", principalId: "" } });
    expect(validateTurn(turn({ author: { id: "1", name: "é".repeat(256) } })).author.name).toHaveLength(256);
  });
  test("text or memory over 100,000 characters are refused (code points, not UTF-16 units)", () => {
    refused({ text: "x".repeat(100_001) });
    refused({ memory: "x".repeat(100_001) });
    expect(validateTurn(turn({ text: "😀".repeat(100_000) })).text.length).toBe(200_000);
  });
  test("memoryVisibility must be shared or private", () => refused({ memoryVisibility: "public" }));
  test("images: nine, a bad type, bad base64 and an empty one are refused", () => {
    const png = { data: "iVBORw0KGgo=", mimeType: "image/png" };
    refused({ images: Array(9).fill(png) });
    refused({ images: [{ ...png, mimeType: "text/plain" }] });
    refused({ images: [{ ...png, data: "abc" }] });
    refused({ images: [{ ...png, data: "ab$=" }] });
    refused({ images: [{ ...png, data: "" }] });
  });
});

describe("image_generate reference_images (17.4)", () => {
  const ws = mkdtempSync(join(tmpdir(), "rich-ref-"));
  mkdirSync(join(ws, "attachments"));
  writeFileSync(join(ws, "attachments", "a.png"), "PNGDATA");
  writeFileSync(join(ws, "attachments", "notes.txt"), "text");
  writeFileSync(join(ws, "secret.png"), "SECRET");
  symlinkSync(join(ws, "secret.png"), join(ws, "attachments", "link.png"));

  test("a named attachment is sent as base64 with its type", () => {
    expect(referenceImages(ws, ["a.png"])).toEqual([{ name: "a.png", mimeType: "image/png", data: Buffer.from("PNGDATA").toString("base64") }]);
  });
  test("more than four is At most four references", () => expect(() => referenceImages(ws, Array(5).fill("a.png"))).toThrow("At most four references"));
  test("an unsafe name is Invalid attachment name", () => {
    expect(() => referenceImages(ws, ["../secret.png"])).toThrow("Invalid attachment name");
    expect(() => referenceImages(ws, [42])).toThrow("Invalid attachment name");
  });
  test("another extension or a symlink is Not an image attachment", () => {
    expect(() => referenceImages(ws, ["notes.txt"])).toThrow("Not an image attachment");
    expect(() => referenceImages(ws, ["link.png"])).toThrow("Not an image attachment");
    expect(() => referenceImages(ws, ["none.png"])).toThrow("Not an image attachment");
  });
  afterAll(() => rmSync(ws, { recursive: true, force: true }));
});
