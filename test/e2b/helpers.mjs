// Shared helpers for the E2B compatibility suite. The SDKs are used exactly
// as an E2B user would: configured only through E2B_API_KEY, E2B_API_URL and
// E2B_SANDBOX_URL (test/integration/e2b_test.go sets them to a fresh
// `sheepfold serve`).
import assert from 'node:assert/strict'
import { randomUUID } from 'node:crypto'

const required = ['E2B_API_KEY', 'E2B_API_URL', 'E2B_SANDBOX_URL']
const missing = required.filter((k) => !process.env[k])
if (missing.length > 0) {
  // Fail loudly: a suite that quietly did nothing would look like a pass.
  throw new Error(
    `${missing.join(', ')} not set: run this suite through ` +
      '`go test ./test/integration -run TestE2BJSSDK` or point the variables at a Sheepfold server'
  )
}
if (process.env.E2B_DEBUG !== undefined) {
  throw new Error('E2B_DEBUG is set: the SDK would bypass the control plane; unset it')
}

// RUN tags every sandbox this process creates, so list filters only ever see
// this run's sandboxes.
export const RUN = randomUUID()

export const sandboxUrl = process.env.E2B_SANDBOX_URL

export const sleep = (ms) => new Promise((r) => setTimeout(r, ms))

// Sandboxes to kill when the file ends, whatever happened.
const live = new Set()

// track registers a sandbox for cleanup and returns it.
export function track(sbx) {
  live.add(sbx)
  return sbx
}

// killAll kills every tracked sandbox; errors are reported but do not mask
// the test's own failure.
export async function killAll() {
  const all = [...live]
  live.clear()
  const res = await Promise.allSettled(all.map((s) => s.kill({ requestTimeoutMs: 30_000 })))
  for (const r of res) {
    if (r.status === 'rejected') console.error('cleanup kill failed:', r.reason)
  }
}

// eventually polls fn until it returns a truthy value or the time is up,
// then returns the last value (so the caller's assertion shows it).
export async function eventually(fn, { timeoutMs = 10_000, intervalMs = 200 } = {}) {
  const deadline = Date.now() + timeoutMs
  for (;;) {
    const v = await fn()
    if (v || Date.now() > deadline) return v
    await sleep(intervalMs)
  }
}

// rejectsWith asserts that p rejects with an instance of cls and returns the
// error for further checks.
export async function rejectsWith(p, cls, what) {
  let err
  try {
    await p
  } catch (e) {
    err = e
  }
  assert.ok(err !== undefined, `${what}: resolved, want ${cls.name}`)
  assert.ok(
    err instanceof cls,
    `${what}: rejected with ${err?.constructor?.name}: ${err?.message}; want ${cls.name}`
  )
  return err
}

// meta is the metadata every sandbox of this run carries.
export function meta(extra = {}) {
  return { suite: RUN, ...extra }
}
