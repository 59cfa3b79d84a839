// Sandbox lifecycle through the unmodified `e2b` SDK: create, connect, list,
// getInfo, setTimeout, pause, kill, isRunning, and how a killed sandbox's
// calls fail.
import { after, test } from 'node:test'
import assert from 'node:assert/strict'
import { AuthenticationError, Sandbox, SandboxNotFoundError, TimeoutError } from 'e2b'
import { Sandbox as CodeSandbox } from '@e2b/code-interpreter'
import { eventually, killAll, meta, rejectsWith, sleep, track } from './helpers.mjs'

after(killAll, { timeout: 60_000 })

const T = { timeout: 120_000 }

test('create with metadata, envs and timeoutMs; getInfo and isRunning', T, async () => {
  const before = Date.now()
  const sbx = track(
    await Sandbox.create({ metadata: meta({ case: 'create' }), envs: { SF_CREATE_ENV: 'from-create' }, timeoutMs: 120_000 })
  )
  assert.match(sbx.sandboxId, /^\S+$/, 'sandboxId')
  assert.equal(await sbx.isRunning(), true)

  const info = await sbx.getInfo()
  assert.equal(info.sandboxId, sbx.sandboxId)
  assert.ok(info.templateId, 'templateId is set')
  assert.equal(info.state, 'running')
  assert.deepEqual(info.metadata, meta({ case: 'create' }))
  assert.ok(info.startedAt instanceof Date && !isNaN(info.startedAt), `startedAt ${info.startedAt}`)
  assert.ok(Math.abs(info.startedAt - before) < 60_000, `startedAt ${info.startedAt.toISOString()} is not near now`)
  const lifetime = info.endAt - info.startedAt
  assert.ok(lifetime > 110_000 && lifetime < 130_000, `endAt - startedAt = ${lifetime} ms, want ~120000`)

  // The static form answers the same.
  const info2 = await Sandbox.getInfo(sbx.sandboxId)
  assert.equal(info2.sandboxId, sbx.sandboxId)
  assert.deepEqual(info2.metadata, info.metadata)

  // envs given at create are the sandbox's environment.
  const r = await sbx.commands.run('echo "$SF_CREATE_ENV"')
  assert.equal(r.stdout, 'from-create\n')
})

test('Sandbox.connect reaches a running sandbox; an unknown id is not found', T, async () => {
  const sbx = track(await Sandbox.create({ metadata: meta({ case: 'connect' }), timeoutMs: 120_000 }))
  await sbx.files.write('/tmp/connect.txt', 'written before connect')

  const again = await Sandbox.connect(sbx.sandboxId)
  assert.equal(again.sandboxId, sbx.sandboxId)
  assert.equal(await again.isRunning(), true)
  assert.equal(await again.files.read('/tmp/connect.txt'), 'written before connect')
  const r = await again.commands.run('cat /tmp/connect.txt')
  assert.equal(r.stdout, 'written before connect')

  // The instance method too.
  const same = await sbx.connect()
  assert.equal(same.sandboxId, sbx.sandboxId)

  await rejectsWith(Sandbox.connect('sf-no-such-sandbox'), SandboxNotFoundError, 'connect to an unknown id')
})

test('Sandbox.list filters by metadata, pages with limit and drops killed sandboxes', T, async () => {
  const group = { case: 'list' }
  const odd = { case: 'list', 'odd key': 'a b=c&d' }
  const sbxs = await Promise.all([
    Sandbox.create({ metadata: meta(group), timeoutMs: 120_000 }).then(track),
    Sandbox.create({ metadata: meta(group), timeoutMs: 120_000 }).then(track),
    Sandbox.create({ metadata: meta(odd), timeoutMs: 120_000 }).then(track),
  ])
  const want = sbxs.map((s) => s.sandboxId).sort()

  // One page with everything.
  const all = await Sandbox.list({ query: { metadata: meta(group) } }).nextItems()
  assert.deepEqual(all.map((s) => s.sandboxId).sort(), want)
  for (const s of all) {
    assert.equal(s.metadata.suite, meta().suite)
    assert.equal(s.state, 'running')
    assert.ok(s.startedAt instanceof Date && !isNaN(s.startedAt))
  }

  // Pages of two: 2 + 1, a token on the first page only.
  const pager = Sandbox.list({ query: { metadata: meta(group) }, limit: 2 })
  const p1 = await pager.nextItems()
  assert.equal(p1.length, 2, 'first page')
  assert.equal(pager.hasNext, true, 'a next token after the first page')
  const p2 = await pager.nextItems()
  assert.equal(p2.length, 1, 'second page')
  assert.equal(pager.hasNext, false, 'no next token after the last page')
  assert.deepEqual([...p1, ...p2].map((s) => s.sandboxId).sort(), want)

  // AND of pairs, with keys and values that need escaping.
  const oddOnly = await Sandbox.list({ query: { metadata: meta(odd) } }).nextItems()
  assert.deepEqual(oddOnly.map((s) => s.sandboxId), [sbxs[2].sandboxId])
  assert.deepEqual(oddOnly[0].metadata, meta(odd))
  const none = await Sandbox.list({ query: { metadata: meta({ case: 'no-such-case' }) } }).nextItems()
  assert.deepEqual(none, [])
  const running = await Sandbox.list({ query: { metadata: meta(group), state: ['running'] } }).nextItems()
  assert.equal(running.length, 3, 'state=running')
  const paused = await Sandbox.list({ query: { metadata: meta(group), state: ['paused'] } }).nextItems()
  assert.deepEqual(paused, [], 'state=paused')

  // A killed sandbox leaves the list.
  assert.equal(await sbxs[0].kill(), true)
  const left = await Sandbox.list({ query: { metadata: meta(group) } }).nextItems()
  assert.deepEqual(left.map((s) => s.sandboxId).sort(), want.filter((id) => id !== sbxs[0].sandboxId))
})

// Where the server can checkpoint (runc), pause frees the sandbox and
// connect brings it back as it was; where it cannot (Kubernetes), pause is
// refused with 501 and the sandbox runs on.
test('pause lists the sandbox as paused; connect resumes it with its files and background server', T, async () => {
  const sbx = track(await Sandbox.create({ metadata: meta({ case: 'pause' }), timeoutMs: 120_000 }))
  await sbx.files.write('/home/user/before-pause.txt', 'kept')
  await sbx.commands.run('python3 -m http.server 8765 --bind 127.0.0.1', { background: true, cwd: '/home/user' })
  const fetch = 'python3 -c "import urllib.request; print(urllib.request.urlopen(\'http://127.0.0.1:8765/before-pause.txt\').read().decode())"'
  const served = async () => {
    try {
      return (await sbx.commands.run(fetch)).stdout.trim() === 'kept'
    } catch {
      return false
    }
  }
  assert.equal(await eventually(served), true, 'the background server answers before the pause')

  let paused
  try {
    paused = await sbx.pause()
  } catch (e) {
    assert.match(String(e.message), /cannot pause|not supported|501/i, `a refused pause says why: ${e.message}`)
    assert.equal(await sbx.isRunning(), true, 'a refused pause leaves the sandbox running')
    return
  }
  assert.equal(paused, true, 'pause')
  assert.equal(await sbx.pause(), false, 'a second pause: already paused')
  assert.equal((await sbx.getInfo()).state, 'paused')
  const listed = await Sandbox.list({ query: { metadata: meta({ case: 'pause' }), state: ['paused'] } }).nextItems()
  assert.deepEqual(listed.map((s) => [s.sandboxId, s.state]), [[sbx.sandboxId, 'paused']])
  const running = await Sandbox.list({ query: { metadata: meta({ case: 'pause' }), state: ['running'] } }).nextItems()
  assert.deepEqual(running, [], 'state=running')

  const back = await Sandbox.connect(sbx.sandboxId)
  assert.equal((await back.getInfo()).state, 'running')
  assert.equal(await back.files.read('/home/user/before-pause.txt'), 'kept')
  assert.equal(await served(), true, 'the background server answers after the resume')
})

test('setTimeout moves endAt; a short timeout kills the sandbox', T, async () => {
  const sbx = track(await Sandbox.create({ metadata: meta({ case: 'timeout' }), timeoutMs: 60_000 }))
  const first = await sbx.getInfo()

  await sbx.setTimeout(300_000)
  const longer = await sbx.getInfo()
  const moved = longer.endAt - first.endAt
  assert.ok(moved > 230_000 && moved < 250_000, `endAt moved by ${moved} ms, want ~240000`)
  const left = longer.endAt - Date.now()
  assert.ok(left > 290_000 && left <= 301_000, `endAt is ${left} ms away, want ~300000`)

  // The static form, shortening it.
  await Sandbox.setTimeout(sbx.sandboxId, 3_000)
  const t0 = Date.now()
  const shorter = await sbx.getInfo()
  const soon = shorter.endAt - Date.now()
  assert.ok(soon > 0 && soon <= 3_500, `endAt is ${soon} ms away after setTimeout(3000)`)
  assert.equal(await sbx.isRunning(), true, 'still running right after setTimeout(3000)')

  const dead = await eventually(async () => !(await sbx.isRunning()), { timeoutMs: 15_000, intervalMs: 250 })
  assert.equal(dead, true, 'isRunning still true 15 s after a 3 s timeout')
  const after = Date.now() - t0
  assert.ok(after >= 2_000, `it died after ${after} ms, before its 3 s timeout`)

  const listed = await Sandbox.list({ query: { metadata: meta({ case: 'timeout' }) } }).nextItems()
  assert.deepEqual(listed, [], 'a timed-out sandbox is not listed')
  await rejectsWith(sbx.getInfo(), SandboxNotFoundError, 'getInfo of a timed-out sandbox')
})

test('kill: true once, then false; unknown ids are false', T, async () => {
  const sbx = track(await Sandbox.create({ metadata: meta({ case: 'kill' }), timeoutMs: 120_000 }))
  assert.equal(await sbx.isRunning(), true)
  assert.equal(await sbx.kill(), true)
  assert.equal(await sbx.isRunning(), false)
  assert.equal(await Sandbox.kill(sbx.sandboxId), false, 'second kill of the same id')
  assert.equal(await Sandbox.kill('sf-no-such-sandbox'), false, 'kill of an unknown id')
  await rejectsWith(Sandbox.getInfo(sbx.sandboxId), SandboxNotFoundError, 'getInfo after kill')
  await rejectsWith(Sandbox.getInfo('sf-no-such-sandbox'), SandboxNotFoundError, 'getInfo of an unknown id')
})

test("a killed sandbox's calls fail as E2B's do", T, async () => {
  const sbx = track(await CodeSandbox.create({ metadata: meta({ case: 'killed-calls' }), timeoutMs: 120_000 }))
  await sbx.files.write('/tmp/x.txt', 'x')
  assert.equal((await sbx.runCode('1 + 1')).text, '2')
  assert.equal(await Sandbox.kill(sbx.sandboxId), true)

  assert.equal(await sbx.isRunning(), false)
  // The proxy answers 502 for a dead sandbox: a stream start becomes
  // SandboxNotFoundError, unary RPCs and file and code calls TimeoutError.
  await rejectsWith(sbx.commands.run('echo hi'), SandboxNotFoundError, 'commands.run after kill')
  await rejectsWith(sbx.files.list('/tmp'), TimeoutError, 'files.list after kill')
  await rejectsWith(sbx.files.read('/tmp/x.txt'), TimeoutError, 'files.read after kill')
  await rejectsWith(sbx.files.write('/tmp/y.txt', 'y'), TimeoutError, 'files.write after kill')
  await rejectsWith(sbx.runCode('1 + 1'), TimeoutError, 'runCode after kill')
  await rejectsWith(Sandbox.connect(sbx.sandboxId), SandboxNotFoundError, 'connect after kill')
  await rejectsWith(sbx.setTimeout(60_000), SandboxNotFoundError, 'setTimeout after kill')
  await rejectsWith(sbx.commands.list(), TimeoutError, 'commands.list after kill')
  await rejectsWith(sbx.files.watchDir('/tmp', () => {}), SandboxNotFoundError, 'watchDir after kill')
  await rejectsWith(sbx.createCodeContext(), TimeoutError, 'createCodeContext after kill')
})

test('killing a sandbox aborts its running command and code', T, async () => {
  const sbx = track(await CodeSandbox.create({ metadata: meta({ case: 'kill-in-flight' }), timeoutMs: 120_000 }))
  const cmd = sbx.commands.run('sleep 60', { timeoutMs: 90_000 })
  const code = sbx.runCode('import time\ntime.sleep(60)', { timeoutMs: 90_000 })
  cmd.catch(() => {})
  code.catch(() => {})
  await sleep(2_000)
  const t0 = Date.now()
  assert.equal(await Sandbox.kill(sbx.sandboxId), true)

  const e1 = await rejectsWith(cmd, TimeoutError, 'a running command when its sandbox is killed')
  assert.match(e1.message, /killed or reached its end of life/, 'the SDK saw the connection drop and probed /health')
  const e2 = await rejectsWith(code, TimeoutError, 'a running runCode when its sandbox is killed')
  assert.match(e2.message, /sandbox was killed while the request was in progress/)
  assert.ok(Date.now() - t0 < 20_000, 'the streams ended promptly after the kill')
})

test('a wrong API key is refused', T, async () => {
  const apiKey = 'e2b_' + '0'.repeat(40)
  await rejectsWith(Sandbox.create({ apiKey, metadata: meta({ case: 'bad-key' }) }), AuthenticationError, 'create with a wrong key')
  await rejectsWith(Sandbox.list({ apiKey }).nextItems(), AuthenticationError, 'list with a wrong key')
})

test('getMetrics: every field of E2B\'s SandboxMetric, from the cgroup and filesystem, every 5 s as in E2B', T, async () => {
  const sbx = track(await Sandbox.create({ metadata: meta({ case: 'metrics' }), timeoutMs: 120_000 }))
  const info = await sbx.getInfo()
  const api = (path) => fetch(`${process.env.E2B_API_URL}${path}`, { headers: { 'X-API-KEY': process.env.E2B_API_KEY } })
  const { diskSizeMB } = await (await api(`/sandboxes/${sbx.sandboxId}`)).json() // not in the SDK's info
  assert.ok(diskSizeMB > 0, `diskSizeMB ${diskSizeMB}`)
  // 8 MB in the sandbox's disk (its writable layer, a tmpfs: page cache
  // of the sandbox's memory), then 2 s of a busy CPU.
  await sbx.commands.run('head -c 8000000 /dev/urandom > /home/user/ballast && timeout 2 sh -c "while :; do :; done" || true')
  const ms = await eventually(
    async () => {
      const all = await sbx.getMetrics()
      return all.length >= 2 ? all : null
    },
    { timeoutMs: 20_000, intervalMs: 1_000 }
  )
  assert.ok(ms, 'fewer than two samples after 20 s')
  for (const m of ms) {
    // The SDK's SandboxMetrics, each field a value (none undefined).
    assert.deepEqual(Object.keys(m).sort(), ['cpuCount', 'cpuUsedPct', 'diskTotal', 'diskUsed', 'memCache', 'memTotal', 'memUsed', 'timestamp'])
    assert.ok(m.timestamp instanceof Date && !isNaN(m.timestamp), `timestamp ${m.timestamp}`)
    assert.equal(m.cpuCount, info.cpuCount, 'cpuCount: the sandbox\'s CPUs, as getInfo says')
    assert.ok(m.cpuUsedPct >= 0 && m.cpuUsedPct <= 100, `cpuUsedPct ${m.cpuUsedPct}`)
    assert.equal(m.memTotal, info.memoryMB * 2 ** 20, 'memTotal: the memory limit, as getInfo says')
    assert.ok(Number.isInteger(m.memCache) && m.memCache >= 0, `memCache ${m.memCache}`)
    assert.ok(m.memUsed > 0 && m.memUsed + m.memCache <= m.memTotal, `mem ${m.memUsed} + cache ${m.memCache} / ${m.memTotal}`)
    assert.equal(m.diskTotal, diskSizeMB * 2 ** 20, 'diskTotal: the disk size, as the sandbox\'s detail says')
    assert.ok(m.diskUsed >= 0 && m.diskUsed <= m.diskTotal, `disk ${m.diskUsed}/${m.diskTotal}`)
  }
  const last = ms[ms.length - 1]
  assert.ok(last.diskUsed >= 8_000_000, `diskUsed ${last.diskUsed} after writing 8 MB`)
  // The file's pages are the sandbox's page cache: memCache, not memUsed
  // (as E2B's memUsed leaves the page cache out).
  assert.ok(last.memCache >= 8_000_000, `memCache ${last.memCache} with an 8 MB file in the disk`)
  assert.ok(ms.some((m) => m.cpuUsedPct > 0), `no CPU use seen: ${ms.map((m) => m.cpuUsedPct)}`)
  const gaps = ms.slice(1).map((m, i) => m.timestamp - ms[i].timestamp)
  assert.ok(gaps.every((g) => g >= 4_000 && g <= 6_000), `sample gaps ${gaps} ms, want ~5000`)

  // On the wire: exactly E2B's SandboxMetric fields.
  const res = await api(`/sandboxes/${sbx.sandboxId}/metrics`)
  assert.equal(res.status, 200)
  const wire = await res.json()
  assert.ok(wire.length >= ms.length)
  assert.deepEqual(Object.keys(wire[0]).sort(), [
    'cpuCount', 'cpuUsedPct', 'diskTotal', 'diskUsed', 'memCache', 'memTotal', 'memUsed', 'timestamp', 'timestampUnix',
  ])
  assert.equal(wire[0].timestampUnix, Math.floor(Date.parse(wire[0].timestamp) / 1000))

  // The static form, and a time window.
  const byId = await Sandbox.getMetrics(sbx.sandboxId)
  assert.ok(byId.length >= ms.length)
  const none = await Sandbox.getMetrics(sbx.sandboxId, { end: new Date(Date.now() - 3_600_000) })
  assert.deepEqual(none, [])
  await sbx.kill()
  await rejectsWith(Sandbox.getMetrics(sbx.sandboxId), SandboxNotFoundError, 'metrics of a killed sandbox')
})

test("the mcp option: 'Failed to start MCP gateway', and no sandbox left running", T, async () => {
  const tag = meta({ case: 'mcp' })
  let err
  try {
    track(await Sandbox.create({ mcp: { exa: { apiKey: 'x' } }, metadata: tag, timeoutMs: 60_000 }))
  } catch (e) {
    err = e
  }
  assert.ok(err, 'create with mcp succeeded')
  assert.equal(err.name, 'SandboxError', `${err.name}: ${err.message}`)
  assert.match(err.message, /^Failed to start MCP gateway: .*mcp-gateway/)
  const left = await Sandbox.list({ query: { metadata: tag, state: ['running'] } }).nextItems()
  assert.deepEqual(left, [], 'the sandbox was left running')
})

// Auto-pause: lifecycle onTimeout 'pause' (the SDK's autoPause) pauses an
// idle sandbox at its timeout instead of killing it, and getInfo says so;
// connect resumes it with its files and connect's timeout. Where the
// server cannot pause (Kubernetes), the create is refused.
test('lifecycle onTimeout pause: an idle sandbox is paused at its timeout; connect resumes it', T, async () => {
  let sbx
  try {
    sbx = track(
      await Sandbox.create({ metadata: meta({ case: 'autopause' }), timeoutMs: 3_000, lifecycle: { onTimeout: 'pause', autoResume: true } })
    )
  } catch (e) {
    // Only a server that cannot pause at all (Kubernetes) may refuse it.
    assert.match(String(e.message), /cannot pause sandboxes/i, `a refused auto-pause says why: ${e.message}`)
    return
  }
  await sbx.files.write('/home/user/auto-pause.txt', 'kept')
  const info = await sbx.getInfo()
  assert.equal(info.lifecycle?.onTimeout, 'pause', `lifecycle ${JSON.stringify(info.lifecycle)}`)
  const paused = await eventually(async () => (await Sandbox.getInfo(sbx.sandboxId)).state === 'paused', {
    timeoutMs: 90_000,
    intervalMs: 500,
  })
  assert.equal(paused, true, 'the idle sandbox was not paused at its timeout')

  const back = await Sandbox.connect(sbx.sandboxId, { timeoutMs: 60_000 })
  const again = await back.getInfo()
  assert.equal(again.state, 'running')
  const left = again.endAt - Date.now()
  assert.ok(left > 50_000 && left <= 61_000, `endAt is ${left} ms away after connect({timeoutMs: 60000})`)
  assert.equal(await back.files.read('/home/user/auto-pause.txt'), 'kept')
})
