// sandbox.git through the unmodified `e2b` SDK: its helpers run git through
// commands.run, against a bare repository inside the sandbox as the remote.
import { after, before, test } from 'node:test'
import assert from 'node:assert/strict'
import { Sandbox } from 'e2b'
import { killAll, meta, track } from './helpers.mjs'

let sbx
before(async () => {
  sbx = track(await Sandbox.create({ metadata: meta({ case: 'git' }), timeoutMs: 300_000 }))
}, { timeout: 120_000 })
after(killAll, { timeout: 60_000 })

const T = { timeout: 120_000 }

test('git: config, clone, status, branches, add, commit, push, pull, auth', T, async () => {
  const remote = '/home/user/remote.git'
  await sbx.commands.run(`git init --bare --initial-branch=main ${remote}`)

  await sbx.git.configureUser('Sheep Fold', 'sheep@example.com', { scope: 'global' })
  assert.equal(await sbx.git.getConfig('user.name', { scope: 'global' }), 'Sheep Fold')
  await sbx.git.setConfig('init.defaultBranch', 'main', { scope: 'global' })
  assert.equal(await sbx.git.getConfig('init.defaultBranch', { scope: 'global' }), 'main')

  // A first clone of the empty remote: commit and push.
  await sbx.git.clone(remote, { path: '/home/user/one' })
  await sbx.files.write('/home/user/one/README.md', '# hello\n')
  let st = await sbx.git.status('/home/user/one')
  assert.equal(st.isClean, false)
  assert.ok(st.fileStatus.some((f) => f.name === 'README.md'), JSON.stringify(st.fileStatus))
  await sbx.git.add('/home/user/one', { all: true })
  await sbx.git.commit('/home/user/one', 'first commit')
  st = await sbx.git.status('/home/user/one')
  assert.equal(st.isClean, true, JSON.stringify(st))
  assert.equal(st.currentBranch, 'main')
  await sbx.git.push('/home/user/one', { remote: 'origin', branch: 'main', setUpstream: true })

  await sbx.git.createBranch('/home/user/one', 'feature')
  const br = await sbx.git.branches('/home/user/one')
  assert.deepEqual([...br.branches].sort(), ['feature', 'main'])
  assert.equal(br.currentBranch, 'feature')
  await sbx.git.checkoutBranch('/home/user/one', 'main')
  assert.equal(await sbx.git.remoteGet('/home/user/one', 'origin'), remote)

  // A second clone sees the push; a new commit there reaches the first by pull.
  await sbx.git.clone(remote, { path: '/home/user/two', branch: 'main' })
  assert.equal(await sbx.files.read('/home/user/two/README.md'), '# hello\n')
  await sbx.files.write('/home/user/two/more.txt', 'more\n')
  await sbx.git.add('/home/user/two', { files: ['more.txt'] })
  await sbx.git.commit('/home/user/two', 'second commit')
  await sbx.git.push('/home/user/two')
  await sbx.git.pull('/home/user/one')
  assert.equal(await sbx.files.read('/home/user/one/more.txt'), 'more\n')
  const log = await sbx.commands.run('git -C /home/user/one log --format=%s')
  assert.equal(log.stdout, 'second commit\nfirst commit\n')

  // Credentials for an HTTPS host go to git's credential store.
  await sbx.git.dangerouslyAuthenticate({ username: 'sheep', password: 'tok3n', host: 'git.example.com' })
  assert.equal(await sbx.git.getConfig('credential.helper', { scope: 'global' }), 'store')
  const cred = await sbx.commands.run('printf "protocol=https\\nhost=git.example.com\\n\\n" | git credential fill')
  assert.match(cred.stdout, /username=sheep\npassword=tok3n/)
})
