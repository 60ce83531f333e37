// names.js: the safe file name rule (spec/rich-mode.md 16.3) and code-point
// length, shared by turn validation, attachments and skills.
export function codePoints(s) {
  let n = 0;
  for (const _ of s) n++;
  return n;
}

// A safe file name: 1-255 characters, no "/", "\" or control characters, not "." or "..".
export function safeName(s) {
  if (typeof s !== "string") return false;
  const n = codePoints(s);
  if (n < 1 || n > 255 || s === "." || s === "..") return false;
  // eslint-disable-next-line no-control-regex
  return !/[\/\\\u0000-\u001f\u007f-\u009f]/.test(s);
}
