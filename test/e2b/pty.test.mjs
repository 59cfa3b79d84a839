// Terminals through the unmodified `e2b` SDK: sandbox.pty (envd's
// process.Process Start with a pty, SendInput, Update, SendSignal) and
// commands.connect to a terminal's process, on a real pseudo-terminal.
import { after, before, test } from 'node:test'
import assert from 'node:assert/strict'
import { Sandbox } from 'e2b'
import { eventually, killAll, meta, track } from './helpers.mjs'

let sbx
before(async () => {
  sbx = track(await Sandbox.create({ metadata: meta({ case: 'pty' }), timeoutMs: 300_000 }))
}, { timeout: 120_000 })
after(killAll, { timeout: 60_000 })

const T = { timeout: 90_000 }
const enc = new TextEncoder()
const dec = new TextDecoder()

test('pty: create, sendInput, resize, connect, kill', T, async () => {
  let out = ''
  const term = await sbx.pty.create({ cols: 80, rows: 24, onData: (d) => (out += dec.decode(d)), timeoutMs: 60_000 })
  assert.ok(term.pid > 0)

  // A real terminal: the shell sees a tty of the size asked for, and what
  // is typed is echoed.
  await sbx.pty.sendInput(term.pid, enc.encode('tty; stty size; echo "me=$(id -un)"\n'))
  assert.ok(await eventually(() => /me=user/.test(out)), `no answer from the terminal: ${JSON.stringify(out)}`)
  assert.match(out, /\/dev\/pts\/\d+/)
  assert.match(out, /24 80/)
  assert.match(out, /echo "me=\$\(id -un\)"/, 'the input was not echoed')

  await sbx.pty.resize(term.pid, { cols: 100, rows: 30 })
  await sbx.pty.sendInput(term.pid, enc.encode('stty size\n'))
  assert.ok(await eventually(() => /30 100/.test(out)), `size after resize: ${JSON.stringify(out)}`)

  // commands.connect to the terminal's process sees what it writes next.
  let seen = ''
  const again = await sbx.commands.connect(term.pid, { onStdout: (d) => (seen += d), timeoutMs: 60_000 })
  assert.equal(again.pid, term.pid)
  const viaPty = await sbx.pty.connect(term.pid, { onData: (d) => (seen += dec.decode(d)), timeoutMs: 60_000 })
  await sbx.pty.sendInput(term.pid, enc.encode('echo second-$((6*7))\n'))
  assert.ok(await eventually(() => /second-42/.test(seen)), `connected stream: ${JSON.stringify(seen)}`)

  // Ctrl-C reaches the foreground job through the terminal.
  await sbx.pty.sendInput(term.pid, enc.encode('sleep 31; echo slept\n'))
  // Once the job runs (a ^C typed before that would go to the shell).
  const running = await eventually(async () => (await sbx.commands.run('pgrep -fx "sleep 31" || true')).stdout.trim())
  assert.ok(running, 'the sleep did not start')
  await sbx.pty.sendInput(term.pid, new Uint8Array([3]))
  await sbx.pty.sendInput(term.pid, enc.encode('echo after-$((1+1))\n'))
  assert.ok(await eventually(() => /after-2/.test(out), { timeoutMs: 10_000 }), `after ^C: ${JSON.stringify(out.slice(-300))}`)
  assert.doesNotMatch(out, /\nslept/)

  assert.equal(await sbx.pty.kill(term.pid), true)
  const res = await term.wait().catch((e) => e)
  assert.equal(res.exitCode, -1, `exit ${JSON.stringify(res)}`)
  await viaPty.wait().catch(() => {})
  await again.wait().catch(() => {})
  assert.equal(await sbx.pty.kill(term.pid), false, 'a killed terminal is gone')
})
