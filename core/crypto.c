/*
 * crypto.c: digests, encodings and randomness for Lua, on OpenSSL's
 * libcrypto: core.sha256_hex(s), core.base64(s) (standard, padded),
 * core.base64url(s) (url-safe, unpadded), core.base64_decode(s) (strict
 * standard base64 -> bytes, or nil and "invalid base64"), core.hex(s) (lowercase) and
 * core.random_hex(nbytes) (RAND_bytes, 1..64 bytes).
 *
 * Output buffers are Lua buffers sized up front (luaL_buffinitsize), so a
 * memory error raised by Lua leaves nothing on the C heap.
 */
#include <stdint.h>
#include <string.h>

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/rand.h>

#include "aux.h"
#include "parts.h"

#define RANDOM_MAX_BYTES 64

static const char hex_digits[] = "0123456789abcdef";

static void push_hex(lua_State *L, const unsigned char *s, size_t n) {
  luaL_Buffer b;
  char *out = luaL_buffinitsize(L, &b, 2 * n);
  for (size_t i = 0; i < n; i++) {
    out[2 * i] = hex_digits[s[i] >> 4];
    out[2 * i + 1] = hex_digits[s[i] & 15];
  }
  luaL_pushresultsize(&b, 2 * n);
}

/* core.sha256_hex(s) -> 64 lowercase hex digits */
static int l_sha256_hex(lua_State *L) {
  size_t n;
  const char *s = luaL_checklstring(L, 1, &n);
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int mdlen = 0;
  if (EVP_Digest(s, n, md, &mdlen, EVP_sha256(), NULL) != 1)
    return luaL_error(L, "sha256 failed");
  push_hex(L, md, mdlen);
  return 1;
}

/*
 * Base64 of s[0..n) with EVP_EncodeBlock (standard alphabet, '=' padding,
 * no line breaks); url=1 maps '+' '/' to '-' '_' and drops the padding.
 * EVP_EncodeBlock takes an int length: longer input goes in chunks whose
 * size is a multiple of 3, so no padding appears in the middle.
 */
static void push_base64(lua_State *L, const unsigned char *s, size_t n, int url) {
  const size_t chunk = (size_t)3 * 1024 * 1024;
  size_t outlen, o = 0;
  luaL_Buffer b;
  char *out;
  if (n > (SIZE_MAX / 4) * 3 - 3) luaL_error(L, "input too large");
  outlen = 4 * ((n + 2) / 3);
  out = luaL_buffinitsize(L, &b, outlen + 1);   /* EVP writes a NUL */
  for (size_t i = 0; i < n; i += chunk) {
    size_t len = n - i < chunk ? n - i : chunk;
    o += (size_t)EVP_EncodeBlock((unsigned char *)out + o, s + i, (int)len);
  }
  if (url) {
    while (o > 0 && out[o - 1] == '=') o--;
    for (size_t i = 0; i < o; i++) {
      if (out[i] == '+') out[i] = '-';
      else if (out[i] == '/') out[i] = '_';
    }
  }
  luaL_pushresultsize(&b, o);
}

/* core.base64(s) -> standard base64 with padding */
static int l_base64(lua_State *L) {
  size_t n;
  const char *s = luaL_checklstring(L, 1, &n);
  push_base64(L, (const unsigned char *)s, n, 0);
  return 1;
}

/* core.base64url(s) -> url-safe base64 without padding */
static int l_base64url(lua_State *L) {
  size_t n;
  const char *s = luaL_checklstring(L, 1, &n);
  push_base64(L, (const unsigned char *)s, n, 1);
  return 1;
}

/*
 * core.base64_decode(s) -> bytes | nil, err. Strict standard base64 (what
 * core.base64 and JavaScript's Buffer produce): a length that is a multiple
 * of 4, the standard alphabet, '=' only as one or two final characters. The
 * text is checked first, then EVP_DecodeBlock decodes it in chunks of a
 * multiple of 4 (it takes an int length) into a userdata buffer, so no
 * luaL_Buffer is open if anything fails.
 */
static int is_b64(unsigned char c) {
  return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '+' ||
         c == '/';
}

static int l_base64_decode(lua_State *L) {
  const size_t chunk = (size_t)4 * 1024 * 1024;
  size_t n, pad = 0, o = 0;
  const unsigned char *s = (const unsigned char *)luaL_checklstring(L, 1, &n);
  unsigned char *out;
  if (n % 4 != 0) goto bad;
  if (n > 0 && s[n - 1] == '=') pad++;
  if (n > 1 && s[n - 2] == '=') pad++;
  for (size_t i = 0; i < n - pad; i++)
    if (!is_b64(s[i])) goto bad;
  out = lua_newuserdatauv(L, n / 4 * 3 + 1, 0);
  for (size_t i = 0; i < n; i += chunk) {
    size_t len = n - i < chunk ? n - i : chunk;
    int got = EVP_DecodeBlock(out + o, s + i, (int)len);
    if (got < 0) goto bad;
    o += (size_t)got;
  }
  lua_pushlstring(L, (const char *)out, o - pad);
  return 1;
bad:
  lua_pushnil(L);
  lua_pushliteral(L, "invalid base64");
  return 2;
}

/* core.hex(s) -> lowercase hex */
static int l_hex(lua_State *L) {
  size_t n;
  const char *s = luaL_checklstring(L, 1, &n);
  if (n > SIZE_MAX / 2) return luaL_error(L, "input too large");
  push_hex(L, (const unsigned char *)s, n);
  return 1;
}

/* core.random_hex(nbytes) -> 2*nbytes lowercase hex digits | nil, err */
static int l_random_hex(lua_State *L) {
  lua_Integer n = luaL_checkinteger(L, 1);
  unsigned char rnd[RANDOM_MAX_BYTES];
  luaL_argcheck(L, n >= 1 && n <= RANDOM_MAX_BYTES, 1, "nbytes must be 1..64");
  if (RAND_bytes(rnd, (int)n) != 1) {
    lua_pushnil(L);
    lua_pushliteral(L, "random source failed");
    return 2;
  }
  push_hex(L, rnd, (size_t)n);
  OPENSSL_cleanse(rnd, sizeof rnd);
  return 1;
}

void sbx__open_crypto(lua_State *L) {
  static const luaL_Reg fns[] = {
    {"sha256_hex", l_sha256_hex}, {"base64", l_base64}, {"base64url", l_base64url},
    {"base64_decode", l_base64_decode}, {"hex", l_hex}, {"random_hex", l_random_hex}, {NULL, NULL}};
  luaL_setfuncs(L, fns, 0);
}
