// Secrets through the unmodified `e2b` SDK: Secret.create, getInfo,
// exists, list (paged), update, destroy and fill against the server's
// store (docs/security.md §15.1), and a sandbox created with E2B's
// placeholder in its envs and network rules, which holds only the
// placeholder.
import { after, test } from 'node:test'
import assert from 'node:assert/strict'
import { InvalidArgumentError, Sandbox, Secret, SecretError, SecretNotFoundError } from 'e2b'
import { killAll, meta, rejectsWith, RUN, track } from './helpers.mjs'

after(killAll, { timeout: 60_000 })

const T = { timeout: 120_000 }

// Names of this run, so that runs sharing an account never meet.
const tag = RUN.slice(0, 8)
const VALUE = `sk-JS-SDK-${RUN}`

test('Secret: create, getInfo, exists, list, update, destroy; never a value', T, async () => {
  const name = `sf-js-${tag}-OpenAI`
  const info = await Secret.create(name, VALUE, { metadata: { env: 'test' } })
  assert.match(info.secretId, /^sec_[0-9a-f]{32}$/)
  assert.equal(info.name, name.toLowerCase(), 'names are lower-cased')
  assert.equal(info.version, 1)
  assert.deepEqual(info.metadata, { env: 'test' })
  assert.ok(info.createdAt instanceof Date && !isNaN(info.createdAt))
  assert.ok(info.updatedAt instanceof Date && !isNaN(info.updatedAt))
  assert.equal('value' in info, false)

  for (const sel of [info.secretId, info.name, name]) {
    const got = await Secret.getInfo(sel)
    assert.equal(got.secretId, info.secretId, `getInfo(${sel})`)
  }
  assert.equal(await Secret.exists(info.secretId), true)
  assert.equal(await Secret.exists(`sf-js-${tag}-missing`), false)

  const other = await Secret.create(`sf-js-${tag}-plain`, 'x')
  assert.deepEqual(other.metadata, {})
  const listed = []
  const pages = Secret.list({ limit: 1 })
  while (pages.hasNext) {
    const page = await pages.nextItems()
    assert.ok(page.length <= 1, `a page of ${page.length}`)
    listed.push(...page.map((s) => s.name))
  }
  assert.ok(listed.includes(info.name) && listed.includes(other.name), `listed ${listed}`)

  const updated = await Secret.update(info.secretId, `${VALUE}-2`, { metadata: { env: 'prod' } })
  assert.equal(updated.secretId, info.secretId)
  assert.equal(updated.version, 2)
  assert.deepEqual(updated.metadata, { env: 'prod' })
  await rejectsWith(Secret.update(`sf-js-${tag}-missing`, 'v'), SecretNotFoundError, 'update of a missing secret')
  await rejectsWith(Secret.create(`sec_${tag}`, 'v'), SecretError, 'a name with the reserved prefix')
  await rejectsWith(Secret.create(name, 'v'), SecretError, 'a name taken')

  assert.equal(await Secret.destroy(info.secretId), true)
  assert.equal(await Secret.destroy(info.secretId), false)
  assert.equal(await Secret.destroy(other.name), true)
  await rejectsWith(Secret.getInfo(info.secretId), SecretNotFoundError, 'getInfo after destroy')
})

test('Secret.fill in envs and network rules: the sandbox holds only the placeholder', T, async () => {
  const name = `sf-js-${tag}-key`
  await Secret.create(name, VALUE)
  try {
    const placeholder = Secret.fill(name)
    assert.equal(placeholder, `\${e2b.secrets.${name}}`)
    assert.throws(() => Secret.fill('a}b'), InvalidArgumentError)

    const sbx = track(
      await Sandbox.create({
        metadata: meta({ case: 'secrets' }),
        timeoutMs: 120_000,
        envs: { OPENAI_API_KEY: placeholder },
        network: {
          allowOut: ['api.example.test'],
          rules: { 'api.example.test': [{ transform: { headers: { Authorization: `Bearer ${placeholder}` } } }] },
        },
      })
    )
    const r = await sbx.commands.run('echo "$OPENAI_API_KEY"; env | grep -c "sk-JS-SDK" || true')
    assert.equal(r.stdout, `${placeholder}\n0\n`)

    // A rule naming a secret the account lacks is refused at create.
    await assert.rejects(
      Sandbox.create({
        metadata: meta({ case: 'secrets-missing' }),
        timeoutMs: 60_000,
        network: {
          allowOut: ['api.example.test'],
          rules: {
            'api.example.test': [
              { transform: { headers: { Authorization: `Bearer ${Secret.fill(`sf-js-${tag}-missing`)}` } } },
            ],
          },
        },
      }),
      (err) => /sf-js-.*-missing/.test(err.message),
      'a rule naming a missing secret'
    )
  } finally {
    await Secret.destroy(name)
  }
})
