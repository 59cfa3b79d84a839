// sandbox.commands through the unmodified `e2b` SDK (envd's process.Process
// Connect RPC service on the E2B data plane).
import { after, before, test } from 'node:test'
import assert from 'node:assert/strict'
import http from 'node:http'
import { CommandExitError, InvalidArgumentError, NotFoundError, Sandbox, TimeoutError } from 'e2b'
import { eventually, killAll, meta, rejectsWith, sleep, track } from './helpers.mjs'

let sbx
before(async () => {
  sbx = track(
    await Sandbox.create({ metadata: meta({ case: 'commands' }), envs: { SF_GLOBAL: 'from-create' }, timeoutMs: 600_000 })
  )
}, { timeout: 120_000 })
after(killAll, { timeout: 60_000 })

const T = { timeout: 90_000 }

test('foreground: stdout, stderr, exit code', T, async () => {
  const r = await sbx.commands.run('echo out; echo err >&2')
  assert.equal(r.exitCode, 0)
  assert.equal(r.stdout, 'out\n')
  assert.equal(r.stderr, 'err\n')
  assert.equal(r.error, undefined)
})

test('special characters and several lines', T, async () => {
  const r = await sbx.commands.run("printf '%s\\n' 'héllo wörld ✓' \"it's\" '$HOME & | ;'\necho second line")
  assert.equal(r.stdout, "héllo wörld ✓\nit's\n$HOME & | ;\nsecond line\n")
})

test('a non-zero exit rejects with CommandExitError', T, async () => {
  const err = await rejectsWith(sbx.commands.run('echo partial; echo bad >&2; exit 3'), CommandExitError, 'exit 3')
  assert.equal(err.exitCode, 3)
  assert.equal(err.stdout, 'partial\n')
  assert.equal(err.stderr, 'bad\n')
})

test('onStdout and onStderr stream while the command runs', T, async () => {
  const out = []
  const errs = []
  let firstAt
  const r = await sbx.commands.run('for i in 1 2 3; do echo o$i; echo e$i >&2; sleep 0.4; done', {
    onStdout: (d) => {
      firstAt ??= Date.now()
      out.push(d)
    },
    onStderr: (d) => errs.push(d),
  })
  const doneAt = Date.now()
  assert.equal(out.join(''), 'o1\no2\no3\n')
  assert.equal(errs.join(''), 'e1\ne2\ne3\n')
  assert.equal(r.stdout, 'o1\no2\no3\n')
  assert.ok(out.length >= 2, `stdout came in ${out.length} callback(s): it was not streamed`)
  assert.ok(doneAt - firstAt >= 500, `first output ${doneAt - firstAt} ms before the end: it was not streamed`)
})

test('background: a handle, then wait()', T, async () => {
  const t0 = Date.now()
  const h = await sbx.commands.run('sleep 3; echo done', { background: true })
  assert.ok(Date.now() - t0 < 2_500, 'run({background:true}) waited for the command')
  assert.ok(Number.isInteger(h.pid) && h.pid > 0, `pid ${h.pid}`)
  assert.equal(h.exitCode, undefined, 'no exit code while running')
  const r = await h.wait()
  assert.equal(r.exitCode, 0)
  assert.equal(r.stdout, 'done\n')
  assert.equal(h.exitCode, 0)
})

test('stdin: sendStdin and closeStdin', T, async () => {
  assert.equal(sbx.commands.supportsStdinClose, true, 'the reported envd version lacks closeStdin')
  const h = await sbx.commands.run('cat; echo "[eof]"', { background: true, stdin: true })
  await h.sendStdin('hello\n')
  await sbx.commands.sendStdin(h.pid, new TextEncoder().encode('wörld\n'))
  await h.closeStdin()
  const r = await h.wait()
  assert.equal(r.stdout, 'hello\nwörld\n[eof]\n')
})

test('without stdin:true a command reads end of file at once', T, async () => {
  const r = await sbx.commands.run('cat; echo "[eof]"', { timeoutMs: 10_000 })
  assert.equal(r.stdout, '[eof]\n')
})

test('envs: sandbox-wide from create, per command without leaking', T, async () => {
  assert.equal((await sbx.commands.run('echo "$SF_GLOBAL"')).stdout, 'from-create\n')
  assert.equal((await sbx.commands.run('echo "$FOO"', { envs: { FOO: 'bar baz' } })).stdout, 'bar baz\n')
  assert.equal((await sbx.commands.run('echo "[$FOO]"')).stdout, '[]\n', 'a per-command env leaked')
  assert.equal((await sbx.commands.run('echo "$SF_GLOBAL"', { envs: { SF_GLOBAL: 'override' } })).stdout, 'override\n')
  assert.equal((await sbx.commands.run('echo "$SF_GLOBAL"')).stdout, 'from-create\n', 'an override leaked')
})

test('cwd: default home, chosen directory, missing directory rejected', T, async () => {
  assert.equal((await sbx.commands.run('pwd')).stdout, '/home/user\n')
  assert.equal((await sbx.commands.run('pwd', { cwd: '/tmp' })).stdout, '/tmp\n')
  await rejectsWith(sbx.commands.run('pwd', { cwd: '/no/such/dir' }), InvalidArgumentError, 'a missing cwd')
})

test("user: the default and user:'user' run as user, with its home", T, async () => {
  assert.equal((await sbx.commands.run('whoami')).stdout, 'user\n')
  const r = await sbx.commands.run('whoami; echo "$HOME"; id -u', { user: 'user' })
  assert.equal(r.stdout, 'user\n/home/user\n1000\n')
})

test("user:'root' runs as root inside the sandbox", T, async () => {
  const r = await sbx.commands.run('whoami; id -u', { user: 'root' })
  assert.equal(r.stdout, 'root\n0\n')
})

test('commands.list shows background commands; commands.kill ends one', T, async () => {
  const a = await sbx.commands.run('sleep 45 # list-a', { background: true })
  const b = await sbx.commands.run('sleep 45 # list-b', { background: true })
  try {
    const procs = await sbx.commands.list()
    for (const [h, tag] of [
      [a, 'list-a'],
      [b, 'list-b'],
    ]) {
      const p = procs.find((p) => p.pid === h.pid)
      assert.ok(p, `pid ${h.pid} not listed: ${JSON.stringify(procs)}`)
      assert.equal(p.cmd, '/bin/bash')
      assert.ok(p.args.some((x) => x.includes(tag)), `args ${JSON.stringify(p.args)}`)
    }

    assert.equal(await sbx.commands.kill(a.pid), true)
    const err = await rejectsWith(a.wait(), CommandExitError, 'wait() of a killed command')
    assert.notEqual(err.exitCode, 0)
    const gone = await eventually(async () => !(await sbx.commands.list()).some((p) => p.pid === a.pid))
    assert.equal(gone, true, 'a killed command is still listed')
    assert.ok((await sbx.commands.list()).some((p) => p.pid === b.pid), 'the other command vanished')

    assert.equal(await b.kill(), true, 'handle.kill()')
    await rejectsWith(b.wait(), CommandExitError, 'wait() after handle.kill()')
    assert.equal(await sbx.commands.kill(4_000_000), false, 'kill of an unknown pid')
  } finally {
    await Promise.allSettled([a.kill(), b.kill()])
  }
})

test('commands.connect re-attaches to a running command', T, async () => {
  const h = await sbx.commands.run('for i in 1 2 3 4 5 6; do echo tick$i; sleep 0.5; done', { background: true })
  await sleep(800)
  await h.disconnect()
  const seen = []
  const h2 = await sbx.commands.connect(h.pid, { onStdout: (d) => seen.push(d) })
  assert.equal(h2.pid, h.pid)
  const r = await h2.wait()
  assert.equal(r.exitCode, 0)
  assert.match(seen.join(''), /tick6\n$/, `output after connect: ${JSON.stringify(seen)}`)
  await rejectsWith(sbx.commands.connect(4_000_000), NotFoundError, 'connect to an unknown pid')
})

test('per-command timeoutMs: TimeoutError, and the command is killed', T, async () => {
  const marker = `/tmp/timeout-marker-${Date.now()}`
  const t0 = Date.now()
  await rejectsWith(
    sbx.commands.run(`sleep 3; touch ${marker}`, { timeoutMs: 1_000 }),
    TimeoutError,
    'a command past its timeoutMs'
  )
  const took = Date.now() - t0
  assert.ok(took < 2_900, `the timeout fired after ${took} ms`)
  await sleep(4_000)
  assert.equal(await sbx.files.exists(marker), false, 'the command kept running past its timeoutMs')
})

test('sudo works for user without a password, with sudo\'s environment rules, and no setuid', T, async () => {
  assert.equal((await sbx.commands.run('sudo id -u')).stdout, '0\n')
  assert.equal((await sbx.commands.run('sudo -n whoami && id -un')).stdout, 'root\nuser\n')
  await sbx.commands.run('sudo mkdir -p /etc/by-sudo && sudo touch /etc/by-sudo/f')
  assert.equal((await sbx.files.getInfo('/etc/by-sudo/f')).owner, 'root')
  const exit = await sbx.commands.run('sudo sh -c "echo out; echo err >&2; exit 3"').catch((e) => e)
  assert.equal(exit.exitCode, 3)
  assert.equal(exit.stdout, 'out\n')
  assert.equal(exit.stderr, 'err\n')
  // Pipes and stdin pass through.
  assert.equal((await sbx.commands.run('echo piped | sudo cat')).stdout, 'piped\n')

  // A command's scoped envs stay with it: sudo resets the environment (as
  // sudo's env_reset), -E keeps it, and later commands never see them.
  const scoped = await sbx.commands.run('sudo printenv SF_SCOPED || echo unset; sudo -E printenv SF_SCOPED', {
    envs: { SF_SCOPED: 'only-here' },
  })
  assert.equal(scoped.stdout, 'unset\nonly-here\n')
  assert.equal((await sbx.commands.run('sudo printenv SF_SCOPED || printenv SF_SCOPED || echo unset')).stdout, 'unset\n')
  assert.equal((await sbx.commands.run('sudo sh -c \'echo $HOME $USER $SUDO_USER\'')).stdout, '/root root user\n')

  // A large environment (100 kB, more than one socket buffer's chunk)
  // reaches the agent whole.
  const big = await sbx.commands.run('sudo -E printenv SF_BIG | wc -c', { envs: { SF_BIG: 'x'.repeat(100000) } })
  assert.equal(big.stdout.trim(), '100001')

  // Only user and root may: another user of the sandbox is refused.
  const guest = await sbx.commands
    .run('setpriv --reuid 1001 --regid 1001 --clear-groups sudo id -u', { user: 'root' })
    .catch((e) => e)
  assert.equal(guest.exitCode, 1)
  assert.match(guest.stderr, /not in the sudoers file/)

  // No setuid anywhere: sudo is an ordinary file, and root under sudo
  // still has no_new_privs and the sandbox's seccomp filter.
  assert.doesNotMatch((await sbx.commands.run('stat -c %A "$(command -v sudo)"')).stdout, /s/)
  const status = await sbx.commands.run('sudo grep -E "^(NoNewPrivs|Seccomp):" /proc/self/status')
  assert.match(status.stdout, /NoNewPrivs:\t1/)
  assert.match(status.stdout, /Seccomp:\t2/)
})

// getHost(port) is the preview of that port on an origin of its own
// ({port}-{id}.{preview domain}:{server port}), which the server routes by
// Host: asked at the API's address with that Host (node resolves no
// *.localhost name), it reaches the app.
test('getHost(port): an app in the sandbox, through its own origin', T, async () => {
  await sbx.files.write('/tmp/site/index.html', 'hello from getHost\n')
  const app = await sbx.commands.run('python3 -m http.server 8123 --bind 127.0.0.1', { background: true, cwd: '/tmp/site' })
  try {
    const api = new URL(process.env.E2B_API_URL)
    const host = sbx.getHost(8123)
    assert.match(host, new RegExp(`^8123-${sbx.sandboxId}\\.[a-z0-9.-]+:${api.port}$`))
    const get = () => new Promise((resolve, reject) => {
      http.get({ host: api.hostname, port: api.port, path: '/index.html', headers: { Host: host } }, (res) => {
        let body = ''
        res.setEncoding('utf8')
        res.on('data', (c) => { body += c })
        res.on('end', () => resolve([res.statusCode, body]))
      }).on('error', reject)
    })
    // The app takes a moment to listen: poll until it answers.
    const got = await eventually(async () => { const r = await get(); return r[0] === 200 ? r : null })
    assert.deepEqual(got, [200, 'hello from getHost\n'])
  } finally {
    await app.kill()
  }
})
