// sandbox.files and signed file URLs through the unmodified `e2b` SDK (envd's
// /files endpoint and filesystem.Filesystem Connect RPC service).
import { after, before, test } from 'node:test'
import assert from 'node:assert/strict'
import { FileNotFoundError, FileType, FilesystemEventType, Sandbox } from 'e2b'
import { eventually, killAll, meta, rejectsWith, sandboxUrl, sleep, track } from './helpers.mjs'

let sbx
before(async () => {
  sbx = track(await Sandbox.create({ metadata: meta({ case: 'files' }), timeoutMs: 600_000 }))
}, { timeout: 120_000 })
after(killAll, { timeout: 60_000 })

const T = { timeout: 90_000 }

test('write and read text, bytes; relative paths resolve against /home/user', T, async () => {
  const w = await sbx.files.write('/home/user/a.txt', 'hello files')
  assert.equal(w.path, '/home/user/a.txt')
  assert.equal(w.name, 'a.txt')
  assert.equal(await sbx.files.read('/home/user/a.txt'), 'hello files')
  assert.equal(await sbx.files.read('a.txt'), 'hello files', 'relative read')

  const rel = await sbx.files.write('rel/b.txt', 'relative')
  assert.equal(rel.path, '/home/user/rel/b.txt')
  assert.equal((await sbx.commands.run('cat /home/user/rel/b.txt')).stdout, 'relative')

  const bytes = new Uint8Array(256).map((_, i) => i)
  await sbx.files.write('/tmp/bytes.bin', bytes.buffer)
  const back = await sbx.files.read('/tmp/bytes.bin', { format: 'bytes' })
  assert.deepEqual(Buffer.from(back), Buffer.from(bytes))

  await sbx.files.write('/tmp/empty.txt', '')
  assert.equal(await sbx.files.read('/tmp/empty.txt'), '')
  assert.equal((await sbx.files.getInfo('/tmp/empty.txt')).size, 0)

  // Overwrite.
  await sbx.files.write('/home/user/a.txt', 'v2')
  assert.equal(await sbx.files.read('/home/user/a.txt'), 'v2')

  // Read of a missing file.
  await rejectsWith(sbx.files.read('/home/user/missing.txt'), FileNotFoundError, 'read of a missing file')
})

test('gzip and octet-stream uploads, gzip and stream reads, file metadata', T, async () => {
  const big = 'line of text\n'.repeat(5_000)
  const gz = await sbx.files.write('/home/user/gz.txt', big, { gzip: true })
  assert.equal(gz.path, '/home/user/gz.txt')
  assert.equal(await sbx.files.read('/home/user/gz.txt'), big)
  assert.equal(await sbx.files.read('/home/user/gz.txt', { gzip: true }), big, 'gzip download')

  await sbx.files.write('/home/user/octet.txt', 'octets', { useOctetStream: true })
  assert.equal((await sbx.commands.run('cat /home/user/octet.txt')).stdout, 'octets')

  const stream = new Blob(['streamed ', 'upload']).stream()
  await sbx.files.write('/home/user/streamed.txt', stream)
  assert.equal(await sbx.files.read('/home/user/streamed.txt'), 'streamed upload')
  const rs = await sbx.files.read('/home/user/streamed.txt', { format: 'stream' })
  assert.equal(await new Response(rs).text(), 'streamed upload')

  const w = await sbx.files.write('/home/user/meta.txt', 'm', { metadata: { origin: 'suite', kind: 'note' } })
  assert.deepEqual(w.metadata, { origin: 'suite', kind: 'note' })
  assert.deepEqual((await sbx.files.getInfo('/home/user/meta.txt')).metadata, { origin: 'suite', kind: 'note' })
})

test('write several files at once', T, async () => {
  const infos = await sbx.files.write([
    { path: '/home/user/multi/a.txt', data: 'A' },
    { path: '/tmp/multi-b.txt', data: 'B' },
    { path: '/home/user/multi/sub/c.txt', data: new Blob(['C']) },
  ])
  assert.deepEqual(
    infos.map((i) => i.path),
    ['/home/user/multi/a.txt', '/tmp/multi-b.txt', '/home/user/multi/sub/c.txt']
  )
  assert.equal(await sbx.files.read('/home/user/multi/a.txt'), 'A')
  assert.equal(await sbx.files.read('/tmp/multi-b.txt'), 'B')
  assert.equal(await sbx.files.read('/home/user/multi/sub/c.txt'), 'C')

  const infos2 = await sbx.files.writeFiles([
    { path: '/home/user/wf/1.txt', data: 'one' },
    { path: '/home/user/wf/2.txt', data: 'two' },
  ])
  assert.equal(infos2.length, 2)
  assert.equal((await sbx.commands.run('cat /home/user/wf/1.txt /home/user/wf/2.txt')).stdout, 'onetwo')
})

test('new files are 0644 and directories 0755, owned by user', T, async () => {
  await sbx.files.write('/home/user/perm/deep/f.txt', 'hello')
  const f = await sbx.files.getInfo('/home/user/perm/deep/f.txt')
  assert.equal(f.type, FileType.FILE)
  assert.equal(f.name, 'f.txt')
  assert.equal(f.path, '/home/user/perm/deep/f.txt')
  assert.equal(f.size, 5)
  assert.equal(f.mode.toString(8), '644')
  assert.equal(f.permissions, '-rw-r--r--')
  assert.equal(f.owner, 'user')
  assert.equal(f.group, 'user')
  assert.ok(f.modifiedTime instanceof Date && Math.abs(f.modifiedTime - Date.now()) < 120_000, `modifiedTime ${f.modifiedTime}`)

  // A parent made by write.
  const parent = await sbx.files.getInfo('/home/user/perm/deep')
  assert.equal(parent.type, FileType.DIR)
  assert.equal(parent.mode.toString(8), '755')
  assert.equal(parent.owner, 'user')

  // makeDir, with parents; again is false.
  assert.equal(await sbx.files.makeDir('/home/user/made/a/b'), true)
  assert.equal(await sbx.files.makeDir('/home/user/made/a/b'), false, 'makeDir of an existing dir')
  for (const p of ['/home/user/made', '/home/user/made/a/b']) {
    const d = await sbx.files.getInfo(p)
    assert.equal(d.type, FileType.DIR, p)
    assert.equal(d.mode.toString(8), '755', p)
    assert.equal(d.permissions, 'drwxr-xr-x', p)
    assert.equal(d.owner, 'user', p)
    assert.equal(d.group, 'user', p)
  }
  // What the sandbox itself sees.
  const ls = await sbx.commands.run('stat -c "%a %U:%G" /home/user/perm/deep/f.txt /home/user/made/a/b')
  assert.equal(ls.stdout, '644 user:user\n755 user:user\n')

  await rejectsWith(sbx.files.getInfo('/home/user/no-such'), FileNotFoundError, 'getInfo of a missing path')
})

test("user:'root' file calls act as root", T, async () => {
  const w = await sbx.files.write('/root/by-root.txt', 'root was here', { user: 'root' })
  assert.equal(w.path, '/root/by-root.txt')
  const f = await sbx.files.getInfo('/root/by-root.txt', { user: 'root' })
  assert.equal(f.owner, 'root')
  assert.equal(f.group, 'root')
  assert.equal(f.mode.toString(8), '644')
  assert.equal(await sbx.files.read('/root/by-root.txt', { user: 'root' }), 'root was here')
  assert.equal(await sbx.files.makeDir('/opt/made-by-root', { user: 'root' }), true)
  assert.equal((await sbx.files.getInfo('/opt/made-by-root')).owner, 'root')
  // Relative paths resolve against root's home.
  const rel = await sbx.files.write('rel-root.txt', 'r', { user: 'root' })
  assert.equal(rel.path, '/root/rel-root.txt')
})

test('list with depth', T, async () => {
  await sbx.files.write([
    { path: '/home/user/tree/f1.txt', data: '1' },
    { path: '/home/user/tree/s/f2.txt', data: '2' },
    { path: '/home/user/tree/s/t/f3.txt', data: '3' },
  ])
  const one = await sbx.files.list('/home/user/tree')
  assert.deepEqual(
    one.map((e) => [e.name, e.type]),
    [
      ['f1.txt', FileType.FILE],
      ['s', FileType.DIR],
    ]
  )
  assert.deepEqual(
    one.map((e) => e.path),
    ['/home/user/tree/f1.txt', '/home/user/tree/s']
  )
  const two = await sbx.files.list('/home/user/tree', { depth: 2 })
  assert.deepEqual(
    two.map((e) => e.path),
    ['/home/user/tree/f1.txt', '/home/user/tree/s', '/home/user/tree/s/f2.txt', '/home/user/tree/s/t']
  )
  const three = await sbx.files.list('tree', { depth: 3 })
  assert.deepEqual(
    three.map((e) => e.path),
    [
      '/home/user/tree/f1.txt',
      '/home/user/tree/s',
      '/home/user/tree/s/f2.txt',
      '/home/user/tree/s/t',
      '/home/user/tree/s/t/f3.txt',
    ]
  )
  await rejectsWith(sbx.files.list('/home/user/no-such-dir'), FileNotFoundError, 'list of a missing dir')
})

test('exists, remove (also of a missing path), rename', T, async () => {
  await sbx.files.write('/home/user/ex/file.txt', 'x')
  assert.equal(await sbx.files.exists('/home/user/ex/file.txt'), true)
  assert.equal(await sbx.files.exists('/home/user/ex'), true, 'a directory exists')
  assert.equal(await sbx.files.exists('/home/user/ex/missing.txt'), false)

  const moved = await sbx.files.rename('/home/user/ex/file.txt', '/home/user/ex/renamed.txt')
  assert.equal(moved.path, '/home/user/ex/renamed.txt')
  assert.equal(moved.name, 'renamed.txt')
  assert.equal(await sbx.files.exists('/home/user/ex/file.txt'), false)
  assert.equal(await sbx.files.read('/home/user/ex/renamed.txt'), 'x')
  await rejectsWith(sbx.files.rename('/home/user/ex/nope', '/home/user/ex/nope2'), FileNotFoundError, 'rename of a missing source')

  await sbx.files.remove('/home/user/ex/renamed.txt')
  assert.equal(await sbx.files.exists('/home/user/ex/renamed.txt'), false)
  await sbx.files.remove('/home/user/ex/never-existed.txt') // must not throw

  await sbx.files.write('/home/user/ex/sub/deep.txt', 'd')
  await sbx.files.remove('/home/user/ex')
  assert.equal(await sbx.files.exists('/home/user/ex'), false, 'remove of a directory is recursive')
})

test('watchDir reports a created file', T, async () => {
  await sbx.files.makeDir('/home/user/watched/sub')
  const events = []
  const h = await sbx.files.watchDir('/home/user/watched', (e) => events.push(e))
  try {
    await sleep(200)
    await sbx.files.write('/home/user/watched/new.txt', 'hello')
    const created = await eventually(() =>
      events.some((e) => e.name === 'new.txt' && e.type === FilesystemEventType.CREATE)
    )
    assert.ok(created, `no create event for new.txt: ${JSON.stringify(events)}`)
    const written = await eventually(() =>
      events.some((e) => e.name === 'new.txt' && e.type === FilesystemEventType.WRITE)
    )
    assert.ok(written, `no write event for new.txt: ${JSON.stringify(events)}`)
    await sbx.files.remove('/home/user/watched/new.txt')
    const removed = await eventually(() =>
      events.some((e) => e.name === 'new.txt' && e.type === FilesystemEventType.REMOVE)
    )
    assert.ok(removed, `no remove event for new.txt: ${JSON.stringify(events)}`)
  } finally {
    await h.stop()
  }
  // Not recursive by default: nothing from sub/.
  assert.ok(!events.some((e) => e.name.startsWith('sub/')), `events from a subdirectory: ${JSON.stringify(events)}`)

  // Recursive: names are relative to the watched directory.
  const rec = []
  const hr = await sbx.files.watchDir('/home/user/watched', (e) => rec.push(e), { recursive: true })
  try {
    await sleep(200)
    await sbx.commands.run('echo x > /home/user/watched/sub/inner.txt')
    const seen = await eventually(() => rec.some((e) => e.name === 'sub/inner.txt' && e.type === FilesystemEventType.CREATE))
    assert.ok(seen, `no recursive create event: ${JSON.stringify(rec)}`)
  } finally {
    await hr.stop()
  }

  await rejectsWith(sbx.files.watchDir('/home/user/not-there', () => {}), FileNotFoundError, 'watchDir of a missing dir')
})

test('downloadUrl and uploadUrl work with plain fetch', T, async () => {
  await sbx.files.write('/home/user/dl.txt', 'download me')
  const dl = await sbx.downloadUrl('/home/user/dl.txt')
  assert.ok(dl.startsWith(sandboxUrl.replace(/\/$/, '') + '/files?'), `downloadUrl ${dl}`)
  assert.match(dl, /[?&]signature=v1_/)
  const res = await fetch(dl)
  assert.equal(res.status, 200, `GET ${dl}: ${res.status}`)
  assert.equal(await res.text(), 'download me')

  const up = await sbx.uploadUrl('/home/user/up.txt')
  const form = new FormData()
  form.append('file', new Blob(['uploaded via url']), 'up.txt')
  const ures = await fetch(up, { method: 'POST', body: form })
  assert.equal(ures.status, 200, `POST ${up}: ${ures.status} ${await ures.clone().text()}`)
  assert.equal(await sbx.files.read('/home/user/up.txt'), 'uploaded via url')
  assert.equal((await sbx.files.getInfo('/home/user/up.txt')).owner, 'user')

  // The signature is checked: tampering with it or the path is refused.
  const bad = new URL(dl)
  bad.searchParams.set('signature', 'v1_' + 'A'.repeat(43))
  assert.equal((await fetch(bad)).status, 401, 'a forged signature')
  const other = new URL(dl)
  other.searchParams.set('path', '/home/user/a.txt')
  assert.equal((await fetch(other)).status, 401, 'a signature for another path')

  // An expired signature.
  const soon = await sbx.downloadUrl('/home/user/dl.txt', { useSignatureExpiration: 1 })
  await sleep(2_500)
  const exp = await fetch(soon)
  assert.equal(exp.status, 401, 'an expired signature')
  assert.deepEqual(await exp.json(), { code: 401, message: 'signature is already expired' })
})

test('writes anywhere as user: missing parents and the file are made, owned by user (as envd does)', T, async () => {
  const w = await sbx.files.write('/0/x.txt', 'at the root')
  assert.equal(w.path, '/0/x.txt')
  assert.equal(await sbx.files.read('/0/x.txt'), 'at the root')
  const many = await sbx.files.write([
    { path: '/srv/new/deep/a.txt', data: 'a' },
    { path: '/1/b.txt', data: 'b' },
  ])
  assert.deepEqual(
    many.map((e) => e.path),
    ['/srv/new/deep/a.txt', '/1/b.txt']
  )
  assert.equal(await sbx.files.makeDir('/opt/made-by-user'), true)
  const ls = await sbx.commands.run('stat -c "%n %a %U:%G" /0 /0/x.txt /srv/new /srv/new/deep /srv/new/deep/a.txt /1/b.txt /opt/made-by-user')
  assert.equal(
    ls.stdout,
    [
      '/0 755 user:user',
      '/0/x.txt 644 user:user',
      '/srv/new 755 user:user',
      '/srv/new/deep 755 user:user',
      '/srv/new/deep/a.txt 644 user:user',
      '/1/b.txt 644 user:user',
      '/opt/made-by-user 755 user:user',
    ].join('\n') + '\n'
  )
  // What existed keeps its owner; the user's own processes still cannot
  // write there.
  assert.equal((await sbx.files.getInfo('/srv')).owner, 'root')
  const denied = await sbx.commands.run('touch /srv/by-process 2>&1 || echo refused')
  assert.match(denied.stdout, /refused/)
})
