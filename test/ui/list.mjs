// The dashboard's page loads with many sandboxes (TestDashboardList200):
// each page is loaded afresh (a new document, the session cookie kept)
// and timed from navigation until its content is on screen: the sandbox
// list until it shows $SANDBOXES rows, a sandbox's page until its
// history and files are shown, the metrics page until its tables are.
// Prints one JSON line of the timings in ms; screenshots in $ARTIFACTS.
import { chromium } from 'playwright-core'
import assert from 'node:assert/strict'
import { mkdirSync } from 'node:fs'

const url = process.env.SHEEPFOLD_URL
const key = process.env.SHEEPFOLD_API_KEY
const want = Number(process.env.SANDBOXES)
const one = process.env.SANDBOX
const rounds = Number(process.env.ROUNDS ?? 5)
const out = process.env.ARTIFACTS
mkdirSync(out, { recursive: true })

const browser = await chromium.launch({ executablePath: process.env.CHROMIUM ?? '/usr/bin/chromium', args: ['--no-sandbox'] })
const page = await browser.newPage({ viewport: { width: 1280, height: 900 } })
const errors = []
page.on('pageerror', (e) => errors.push(e.message))
const times = { list: [], sandbox: [], metrics: [] }
try {
  await page.goto(`${url}/ui/`)
  await page.fill('#key', key)
  await page.click('#login')
  await page.waitForSelector('#sandboxes')
  const load = async (name, hash, ready) => {
    for (let i = 0; i < rounds; i++) {
      const t0 = Date.now()
      await page.goto(`${url}/ui/?load=${name}${i}${hash}`)
      await ready()
      times[name].push(Date.now() - t0)
    }
  }
  await load('list', '#/', () => page.waitForFunction((n) => document.querySelectorAll('#sandboxes tbody tr').length === n, want, { timeout: 60000 }))
  assert.equal(await page.locator('#sandboxes tbody tr').count(), want)
  await page.screenshot({ path: `${out}/list-${want}.png` })
  await load('sandbox', `#/sandbox/${one}`, () => page.waitForSelector('#executions .execution, #executions >> text=No executions yet', { timeout: 60000 })
    .then(() => page.waitForSelector('#files li', { timeout: 60000 })))
  await page.screenshot({ path: `${out}/sandbox-of-${want}.png` })
  await load('metrics', '#/metrics', () => page.waitForSelector('#m-sandboxes td', { timeout: 60000 }))
  assert.equal(await page.locator('#m-sandboxes tr', { hasText: 'running' }).locator('td.num').textContent(), String(want))
  await page.screenshot({ path: `${out}/metrics-of-${want}.png` })
  assert.deepEqual(errors, [], 'errors in the page')
} finally {
  await browser.close()
}
console.log(JSON.stringify(times))
