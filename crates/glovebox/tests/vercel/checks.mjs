// Tiny assertion helpers for the Vercel-compatibility scripts (run by tests/vercel.rs, which
// copies this file beside each script). Each check prints one `ok: …` line; the first
// failure prints `FAIL: …` and exits non-zero. `done()` prints the closing line the Rust
// harness looks for.

let count = 0;

export function check(name, cond, detail) {
  if (!cond) {
    console.log(`FAIL: ${name}`, detail === undefined ? "" : JSON.stringify(detail));
    process.exit(1);
  }
  count++;
  console.log(`ok: ${name}`);
}

// What `f()` threw (the SDK's own error, for a refused call), or null.
export async function sdkError(f) {
  try {
    await f();
    return null;
  } catch (e) {
    return e;
  }
}

export function done(what) {
  console.log(`vercel ${what}: ${count} checks ok`);
}
