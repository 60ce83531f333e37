// bun_types.ts: the Bun package's declarations as a TypeScript user's checker
// sees them. spec/install/install_test.sh copies this file into a fresh
// `bun init -y` project (outside the checkout, its default tsconfig: strict,
// noUncheckedIndexedAccess, skipLibCheck), adds the packed tarball, writes
// entries.ts (one import per "exports" entry of the package) and runs
// `bunx tsc --noEmit` there: no error may be reported. The probes below fail
// the check (TS2578, an unused @ts-expect-error) if the declarations came
// through as `any` instead of the package's real types.
import sandbox, { CLAIM_NAME, libraryPath, PiSandboxRuntime, safeFetch } from "pi-roundtable-sandbox";
import type { SandboxOptions, SandboxPlugin, TurnResult } from "pi-roundtable-sandbox/types";

const options: SandboxOptions = {};
export const plugin: Promise<SandboxPlugin> = sandbox(options);
export const lib: string = libraryPath();
export const claim: "sandbox" = CLAIM_NAME;
export type Turn = TurnResult;
export type Runtime = PiSandboxRuntime;
export const fetcher: typeof safeFetch = safeFetch;

// @ts-expect-error: a number is no SandboxOptions (the declarations are typed, not any)
export const wrong = sandbox(42);
// @ts-expect-error: libraryPath returns a string
export const notNumber: number = libraryPath();
