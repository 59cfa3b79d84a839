// The dashboard end to end in a real browser (Debian's chromium, driven by
// playwright-core): log in, create a sandbox, run code that plots and see
// the PNG, see a blocked import appear live in the events, open a preview
// link, and check the key is kept nowhere in the page. Each step leaves a
// screenshot in $ARTIFACTS. Run by test/integration's TestDashboardBrowser.
import { chromium } from 'playwright-core'
import assert from 'node:assert/strict'
import { mkdirSync } from 'node:fs'

const url = process.env.SHEEPFOLD_URL
const key = process.env.SHEEPFOLD_API_KEY
const policySandbox = process.env.POLICY_SANDBOX
const previewSandbox = process.env.PREVIEW_SANDBOX // a sandbox serving HTTP on port 8000
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
  const listMS = Date.now() - t0
  console.log(`the sandbox list showed ${listMS} ms after login`)
  assert.ok(listMS < 1000, `the sandbox list took ${listMS} ms`)
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
    await page.goto(`${url}/ui/#/sandbox/${previewSandbox}`)
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
