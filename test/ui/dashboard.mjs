// The dashboard end to end in a real browser (Debian's chromium, driven by
// playwright-core): log in, create a sandbox, run code that plots and see
// the PNG, see a blocked import appear live in the events, see a plot run
// through the API (not the page) in the sandbox's execution history, open
// a preview link, watch the metrics page move, and check the key is kept
// nowhere in the page. Each step leaves a screenshot in $ARTIFACTS. Run by
// test/integration's TestDashboardBrowser.
import { chromium } from 'playwright-core'
import assert from 'node:assert/strict'
import { mkdirSync } from 'node:fs'

const url = process.env.SHEEPFOLD_URL
const key = process.env.SHEEPFOLD_API_KEY
const policySandbox = process.env.POLICY_SANDBOX
const previewSandbox = process.env.PREVIEW_SANDBOX // a sandbox serving HTTP on port 8000, where the API ran a plot
const out = process.env.ARTIFACTS
mkdirSync(out, { recursive: true })

const browser = await chromium.launch({ executablePath: process.env.CHROMIUM ?? '/usr/bin/chromium', args: ['--no-sandbox'] })
let step = 0
const page = await browser.newPage({ viewport: { width: 1280, height: 900 } })
const errors = []
page.on('pageerror', (e) => errors.push(e.message))
const shot = async (name) => {
  step++
  await page.screenshot({ path: `${out}/${String(step).padStart(2, '0')}-${name}.png`, fullPage: true })
  console.log(`step ${step}: ${name}`)
}
try {
  // Log in.
  await page.goto(`${url}/ui/`)
  await page.fill('#key', 'sf_wrong')
  await page.click('#login')
  await page.waitForSelector('.login .error')
  await shot('login-refused')
  await page.fill('#key', key)
  const t0 = Date.now()
  await page.click('#login')
  await page.waitForSelector('#sandboxes, #no-sandboxes')
  // A figure, not an assertion (the machine may be loaded): the bound of
  // 1 s with 200 sandboxes is measured by TestDashboardList200.
  console.log(`the sandbox list showed ${Date.now() - t0} ms after login`)
  await shot('sandboxes')

  // The key is kept nowhere the page can reach.
  const kept = await page.evaluate(() => JSON.stringify([location.href, document.cookie, { ...localStorage }, { ...sessionStorage }]))
  assert.ok(!kept.includes(key), 'the key is in the page: ' + kept)

  // Create a sandbox and plot.
  await page.click('#create')
  await page.waitForURL(/#\/sandbox\/\w+/)
  await page.waitForSelector('#code')
  await shot('sandbox')
  await page.fill('#code', 'import matplotlib.pyplot as plt\nplt.plot([3, 1, 4, 1, 5])\nplt.title("stock")\nplt.show()\nprint("plotted")')
  await page.click('#run')
  const img = await page.waitForSelector('#executions img.result', { timeout: 60000 })
  assert.match(await img.getAttribute('src'), /^data:image\/png;base64,iVBOR/)
  assert.ok(await page.isVisible('#executions pre.stdout >> text=plotted'))
  await shot('chart')
  // Kill it from its page.
  await page.click('button.danger')
  await page.waitForURL(/#\/$/)

  // A blocked import appears live in the sandbox's events.
  await page.goto(`${url}/ui/#/sandbox/${policySandbox}`)
  await page.waitForSelector('#events')
  await page.fill('#code', 'import socket')
  await page.click('#run')
  await page.waitForSelector('#executions >> text=ERR_MODULE_BLOCKED', { timeout: 30000 })
  await page.waitForSelector('#events li.security_violation >> text=module_blocked', { timeout: 30000 })
  await shot('blocked-live')
  await page.goto(`${url}/ui/#/security`)
  await page.waitForSelector('#security li.security_violation >> text=socket', { timeout: 30000 })
  await shot('security-events')

  // Usage charts and gauges.
  await page.goto(`${url}/ui/#/usage`)
  await page.waitForSelector('#usage svg rect', { timeout: 30000 })
  await page.waitForSelector('#usage meter, #usage .gauge')
  await shot('usage')

  {
    // The plot the API ran (TestDashboardBrowser, through the Go SDK)
    // shows in the sandbox's history, its PNG rendered.
    await page.goto(`${url}/ui/#/sandbox/${previewSandbox}`)
    const plotted = page.locator('#executions .execution', { hasText: 'plotted-by-api' })
    await plotted.waitFor({ timeout: 30000 })
    assert.match(await plotted.locator('img.result').getAttribute('src'), /^data:image\/png;base64,iVBOR/)
    assert.ok(await plotted.locator('pre.code >> text=plt.title("from the API")').isVisible())
    await shot('api-execution-history')
    const link = await page.waitForSelector('#previews a', { timeout: 30000 })
    await shot('previews')
    const href = await link.getAttribute('href')
    const preview = await browser.newPage()
    const r = await preview.goto(new URL(href, url).toString())
    assert.equal(r.status(), 200, `preview ${href}: ${r.status()}`)
    assert.ok((await preview.textContent('h1')).includes('hello from the sandbox'))
    await preview.screenshot({ path: `${out}/${String(++step).padStart(2, '0')}-preview-open.png` })
    console.log(`step ${step}: preview opened`)
  }

  // The metrics page: the account's executions counted, the service's
  // latencies, live (a poll later the figures move with new work).
  await page.goto(`${url}/ui/#/metrics`)
  await page.waitForSelector('#m-executions td >> text=success', { timeout: 30000 })
  await page.waitForSelector('#m-latency td >> text=execution')
  const count = async () => Number(await page.locator('#m-executions tr', { hasText: 'success' }).locator('td.num').textContent())
  const before = await count()
  const r = await fetch(`${url}/v1/sandboxes/${previewSandbox}/execute`, { method: 'POST',
    headers: { Authorization: `Bearer ${key}`, 'Content-Type': 'application/json' }, body: JSON.stringify({ code: '1+1' }) })
  assert.equal(r.status, 200)
  await page.waitForFunction(([b]) => {
    const row = [...document.querySelectorAll('#m-executions tr')].find(tr => tr.textContent.includes('success'))
    return row && Number(row.querySelector('td.num').textContent) > b
  }, [before], { timeout: 30000 })
  console.log(`successful executions on the metrics page: ${before} then ${await count()}`)
  await shot('metrics')

  // Log out: the session no longer works.
  await page.goto(`${url}/ui/`)
  await page.click('text=Log out')
  await page.waitForSelector('#key')
  await shot('logged-out')
  assert.deepEqual(errors, [], 'errors in the page')
} finally {
  await browser.close()
}
console.log('ok')
