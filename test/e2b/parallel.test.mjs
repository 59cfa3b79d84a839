// Ten sandboxes used at once through the unmodified `@e2b/code-interpreter`
// SDK: create, run code, kill, all concurrently.
import { after, test } from 'node:test'
import assert from 'node:assert/strict'
import { Sandbox } from '@e2b/code-interpreter'
import { killAll, meta, track } from './helpers.mjs'

after(killAll, { timeout: 60_000 })

const N = 10

test(`${N} sandboxes in parallel`, { timeout: 300_000 }, async () => {
  const ids = await Promise.all(
    Array.from({ length: N }, async (_, i) => {
      const sbx = track(await Sandbox.create({ metadata: meta({ case: 'parallel', i: String(i) }), timeoutMs: 300_000 }))
      const ex = await sbx.runCode(`n = ${i}\nn * 2`)
      assert.equal(ex.error, undefined, `sandbox ${i}: ${JSON.stringify(ex.error)}`)
      assert.equal(ex.text, String(i * 2), `sandbox ${i}`)
      const r = await sbx.commands.run(`echo ${i}`)
      assert.equal(r.stdout, `${i}\n`, `sandbox ${i} command`)
      assert.equal(await sbx.kill(), true, `kill sandbox ${i}`)
      assert.equal(await sbx.isRunning(), false, `sandbox ${i} after kill`)
      return sbx.sandboxId
    })
  )
  assert.equal(new Set(ids).size, N, 'sandbox ids are distinct')
  const left = await Sandbox.list({ query: { metadata: meta({ case: 'parallel' }) } }).nextItems()
  assert.deepEqual(left, [], 'killed sandboxes are still listed')
})
