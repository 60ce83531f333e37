// fetch.test.ts: safeFetch, assertPublicUrl, pinnedTransport,
// isPublicAddress and scrubDiagnostic through the bridge's utility engine.
// Traffic goes only to 127.0.0.1: the trusted resolve seam answers a public
// address and the transport seam sends the vetted attempt to a loopback
// Bun.serve through the real pinned transport (a port override).
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import {
  assertPublicUrl,
  disposeUtilityEngine,
  FetchTimeoutError,
  isPublicAddress,
  isUnsafeUrlError,
  type LookupAddress,
  pinnedTransport,
  ResolveError,
  ResponseTooLargeError,
  safeFetch,
  type SafeFetchOptions,
  scrubDiagnostic,
  TransportError,
  UnsafeUrlError,
} from "../src/index.ts";
import { utilityEngine } from "../src/utility.ts";

interface Seen {
  path: string;
  host: string | null;
  headers: Record<string, string>;
}

let server: ReturnType<typeof Bun.serve>;
const seen: Seen[] = [];

beforeAll(() => {
  server = Bun.serve({
    hostname: "127.0.0.1",
    port: 0,
    fetch(req) {
      const url = new URL(req.url);
      seen.push({ path: url.pathname, host: req.headers.get("host"), headers: Object.fromEntries(req.headers) });
      switch (url.pathname) {
        case "/bytes":
          return new Response(new Uint8Array([0, 255, 1, 128, 10]), { headers: { "content-type": "application/octet-stream" } });
        case "/gzip":
          return new Response(Bun.gzipSync(new TextEncoder().encode("decoded by the engine")), {
            headers: { "content-encoding": "gzip", "content-type": "text/plain" },
          });
        case "/big":
          return new Response("x".repeat(5000), { headers: { "content-type": "text/plain" } });
        case "/to-other":
          return new Response(null, { status: 302, headers: { location: "http://other.example/landing" } });
        case "/to-same":
          return new Response(null, { status: 301, headers: { location: "/landing?q=1" } });
        case "/loop":
          return new Response(null, { status: 302, headers: { location: "/loop" } });
        default:
          return new Response(`hello ${url.pathname}${url.search}`, { headers: { "content-type": "text/plain" } });
      }
    },
  });
});

afterAll(() => {
  server.stop(true);
  disposeUtilityEngine();
});

const PUBLIC: LookupAddress[] = [{ address: "93.184.216.34", family: 4 }];

/** Seams that make every vetted public address reach the loopback server; counts lookups. */
function loopback(extra: SafeFetchOptions = {}): SafeFetchOptions & { lookups: string[] } {
  const lookups: string[] = [];
  return {
    lookups,
    resolve: (hostname) => {
      lookups.push(hostname);
      return PUBLIC;
    },
    transport: (url, _address, signal, maxBytes, headers) =>
      pinnedTransport(url, { address: "127.0.0.1", family: 4, port: server.port }, signal, maxBytes, headers),
    ...extra,
  };
}

async function failure(p: Promise<unknown>): Promise<Error> {
  try {
    await p;
  } catch (err) {
    return err as Error;
  }
  throw new Error("expected a rejection");
}

describe("isPublicAddress", () => {
  test("strict literals in public space only", () => {
    expect(isPublicAddress("93.184.216.34")).toBe(true);
    expect(isPublicAddress("2606:2800:220:1::1")).toBe(true);
    for (const t of ["127.0.0.1", "10.0.0.1", "169.254.169.254", "::1", "::ffff:127.0.0.1", "fe80::1%eth0", "0x7f.1", "example.com", ""]) {
      expect(isPublicAddress(t)).toBe(false);
    }
    expect(isPublicAddress(42 as unknown as string)).toBe(false);
  });
});

describe("scrubDiagnostic", () => {
  test("masks credentials and bounds the text", () => {
    expect(scrubDiagnostic("failed: https://ops@example.com:pw@api.example.com/x")).toBe(
      "failed: https://[redacted]@api.example.com/x",
    );
    expect(scrubDiagnostic("password=hunter2 max_tokens=5")).toBe("password=[redacted] max_tokens=5");
    expect(scrubDiagnostic("abcdef", 4)).toBe("abc…");
    expect(scrubDiagnostic("x".repeat(5000), Infinity)).toBe("x".repeat(5000));
    expect(scrubDiagnostic(12345)).toBe("12345");
  });

  test("refuses an invalid limit", () => {
    for (const max of [0, -1, 1.5, NaN, -Infinity]) {
      expect(() => scrubDiagnostic("x", max)).toThrow("Invalid diagnostic limit");
    }
  });
});

describe("safeFetch", () => {
  test("returns bytes, status, canonical final URL and lower-case headers", async () => {
    const o = loopback();
    const r = await safeFetch("HTTP://Example.COM:80/bytes#frag", o);
    expect(r.status).toBe(200);
    expect(r.statusText).toBe("OK");
    expect(r.url).toBe("http://example.com/bytes");
    expect(r.headers["content-type"]).toBe("application/octet-stream");
    expect([...r.data]).toEqual([0, 255, 1, 128, 10]);
    expect(o.lookups).toEqual(["example.com"]);
    const req = seen.at(-1)!;
    expect(req.host).toBe("example.com");
    expect(req.headers["accept-encoding"]).toBe("identity");
    expect(req.headers["user-agent"]).toBe("pi-roundtable-sandbox");
  });

  test("decodes gzip itself and drops content-encoding", async () => {
    const r = await safeFetch("http://example.com/gzip", loopback());
    expect(new TextDecoder().decode(r.data)).toBe("decoded by the engine");
    expect(r.headers["content-encoding"]).toBeUndefined();
  });

  test("follows redirects with a fresh lookup per hop and drops trusted headers across origins", async () => {
    const o = loopback({ headers: { "x-trusted": "secret-ish", "accept-encoding": "br" } });
    const r = await safeFetch("http://example.com/to-other", o);
    expect(r.url).toBe("http://other.example/landing");
    expect(o.lookups).toEqual(["example.com", "other.example"]);
    const [first, second] = seen.slice(-2);
    expect(first!.headers["x-trusted"]).toBe("secret-ish");
    expect(first!.headers["accept-encoding"]).toBe("identity");
    expect(second!.headers["x-trusted"]).toBeUndefined();
    const same = loopback({ headers: { "x-trusted": "kept" } });
    const r2 = await safeFetch("http://example.com/to-same", same);
    expect(r2.url).toBe("http://example.com/landing?q=1");
    expect(same.lookups).toEqual(["example.com", "example.com"]);
    expect(seen.at(-1)!.headers["x-trusted"]).toBe("kept");
  });

  test("followRedirects=false returns the redirect; maxRedirects bounds a loop", async () => {
    const r = await safeFetch("http://example.com/to-other", loopback({ followRedirects: false }));
    expect(r.status).toBe(302);
    expect(r.headers.location).toBe("http://other.example/landing");
    expect(r.data.length).toBe(0);
    const e = await failure(safeFetch("http://example.com/loop", loopback({ maxRedirects: 2 })));
    expect(e).toBeInstanceOf(UnsafeUrlError);
    expect(e.message).toBe("Too many redirects");
  });

  test("refuses non-public, credentialed and non-HTTP URLs before any connection", async () => {
    const cases: [string, string][] = [
      ["http://127.0.0.1/", "URL resolves to a non-public address"],
      ["http://[::ffff:10.0.0.1]/", "URL resolves to a non-public address"],
      ["http://user:pw@example.com/", "Only credential-free HTTP(S) URLs are allowed"],
      ["file:///etc/passwd", "Only credential-free HTTP(S) URLs are allowed"],
      ["http://example.com:0/", "Port 0 is not allowed"],
      ["not a url", "Invalid URL"],
    ];
    for (const [url, message] of cases) {
      const e = await failure(safeFetch(url));
      expect(e).toBeInstanceOf(UnsafeUrlError);
      expect(e.message).toBe(message);
      expect(isUnsafeUrlError(e)).toBe(true);
    }
    const rebinding = await failure(
      safeFetch("http://example.com/", { resolve: () => [PUBLIC[0]!, { address: "10.1.2.3", family: 4 }] }),
    );
    expect(rebinding.message).toBe("URL resolves to a non-public address");
    const own = await failure(safeFetch("http://example.com/", { ...loopback(), localAddresses: () => ["93.184.216.34"] }));
    expect(own.message).toBe("URL resolves to a non-public address");
  });

  test("refuses invalid bounds and headers", async () => {
    for (const bad of [{ maxBytes: 0 }, { maxBytes: 1.5 }, { maxBytes: Infinity }, { timeoutMs: NaN }, { maxBytes: 33554433 }, { maxRedirects: 11 }, { followRedirects: "yes" }]) {
      const e = await failure(safeFetch("http://example.com/", bad as SafeFetchOptions));
      expect(e.message).toBe("Invalid fetch bounds");
    }
    for (const headers of <Record<string, string>[]>[{ host: "x" }, { "x-a": "a\r\nb" }, { "bad name": "x" }, { "proxy-authorization": "x" }]) {
      const e = await failure(safeFetch("http://example.com/", { headers }));
      expect(e.message).toBe("Invalid fetch headers");
    }
  });

  test("a declared length over maxBytes is ResponseTooLargeError with status and headers", async () => {
    const e = (await failure(safeFetch("http://example.com/big", loopback({ maxBytes: 100 })))) as ResponseTooLargeError;
    expect(e).toBeInstanceOf(ResponseTooLargeError);
    expect(e.message).toBe("Response exceeds bounds");
    expect(e.status).toBe(200);
    expect(e.headers["content-length"]).toBe("5000");
    expect(isUnsafeUrlError(e)).toBe(true);
  });

  test("https to http redirects are refused (transport seam answers)", async () => {
    const e = await failure(
      safeFetch("https://example.com/", {
        resolve: () => PUBLIC,
        transport: (url) => ({ url, status: 302, headers: { location: "http://example.com/plain" } }),
      }),
    );
    expect(e.message).toBe("Redirect from HTTPS to HTTP refused");
  });

  test("falls back within the vetted list only for connection codes; other seam errors reach the caller", async () => {
    const tried: string[] = [];
    const r = await safeFetch("http://example.com/fallback", {
      resolve: () => [
        { address: "93.184.216.34", family: 4 },
        { address: "93.184.216.35", family: 4 },
      ],
      transport: (url, address, signal, maxBytes, headers) => {
        tried.push(address.address);
        if (address.address === "93.184.216.34") throw new TransportError("refused", "ECONNREFUSED");
        return pinnedTransport(url, { address: "127.0.0.1", family: 4, port: server.port }, signal, maxBytes, headers);
      },
    });
    expect(tried).toEqual(["93.184.216.34", "93.184.216.35"]);
    expect(new TextDecoder().decode(r.data)).toBe("hello /fallback");

    const mine = new TypeError("the seam's own failure");
    const tried2: string[] = [];
    const e = await failure(
      safeFetch("http://example.com/", {
        resolve: () => [
          { address: "93.184.216.34", family: 4 },
          { address: "93.184.216.35", family: 4 },
        ],
        transport: (_u, address) => {
          tried2.push(address.address);
          throw mine;
        },
      }),
    );
    expect(e).toBe(mine);
    expect(tried2).toEqual(["93.184.216.34"]);

    const all = await failure(
      safeFetch("http://example.com/", {
        resolve: () => PUBLIC,
        transport: () => {
          throw new TransportError("refused", "ECONNREFUSED");
        },
      }),
    );
    expect(all.message).toBe("No vetted address could be reached");
  });

  test("a real refused connection is a TransportError with its errno code", async () => {
    const closed = Bun.serve({ hostname: "127.0.0.1", port: 0, fetch: () => new Response("") });
    const port = closed.port;
    closed.stop(true);
    const e = (await failure(pinnedTransport("http://example.com/", { address: "127.0.0.1", family: 4, port }))) as TransportError;
    expect(e).toBeInstanceOf(TransportError);
    expect(e.code).toBe("ECONNREFUSED");
  });

  test("the caller's signal rejects with exactly its reason; the deadline is a TimeoutError", async () => {
    const reason = new Error("the host gave up");
    const ac = new AbortController();
    const p = safeFetch("http://example.com/", { signal: ac.signal, resolve: () => new Promise<LookupAddress[]>(() => {}) });
    setTimeout(() => ac.abort(reason), 30);
    expect(await failure(p)).toBe(reason);

    const done = new AbortController();
    done.abort("already");
    await expect(safeFetch("http://example.com/", { signal: done.signal })).rejects.toBe("already");

    const t0 = performance.now();
    const e = await failure(safeFetch("http://example.com/", { timeoutMs: 150, resolve: () => new Promise<LookupAddress[]>(() => {}) }));
    expect(e).toBeInstanceOf(FetchTimeoutError);
    expect(e.name).toBe("TimeoutError");
    expect(e.message).toBe("Fetch deadline exceeded");
    expect(performance.now() - t0).toBeLessThan(5000);
    // The seams that never settle were abandoned with their calls: nothing
    // keeps the bridge polling (or the process alive) for them.
    await Bun.sleep(20);
    expect(utilityEngine().hostCalls).toBe(0);
    expect(utilityEngine().inFlight).toBe(0);
  });

  test("a resolver failure is a ResolveError with the resolver's text", async () => {
    const e = await failure(
      safeFetch("http://example.com/", {
        resolve: () => {
          throw new Error("no such host");
        },
      }),
    );
    expect(e).toBeInstanceOf(ResolveError);
    expect(e.message).toBe("no such host");
  });
});

describe("assertPublicUrl", () => {
  test("returns the canonical URL without fragment, refuses non-public answers, has its own deadline", async () => {
    expect(await assertPublicUrl("HTTPS://Example.com:443/a/../b?x#frag", { resolve: () => PUBLIC })).toBe(
      "https://example.com/b?x",
    );
    const e = await failure(assertPublicUrl("http://example.com/", { resolve: () => [{ address: "192.168.1.1", family: 4 }] }));
    expect(e).toBeInstanceOf(UnsafeUrlError);
    expect(e.message).toBe("URL resolves to a non-public address");
    const t = await failure(assertPublicUrl("http://example.com/", { timeoutMs: 100, resolve: () => new Promise<LookupAddress[]>(() => {}) }));
    expect(t).toBeInstanceOf(FetchTimeoutError);
    expect(t.message).toBe("URL check deadline exceeded");
    const b = await failure(assertPublicUrl("http://example.com/", { timeoutMs: 0 }));
    expect(b.message).toBe("Invalid fetch bounds");
  });
});
