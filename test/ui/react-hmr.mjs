// Hot reload of the react-ts template through a preview, in Debian's
// chromium driven by playwright-core (internal/server's TestReactTSPreview
// runs it and judges the results).
//
// Opens $PAGE (a sandbox's preview of Vite's dev server), waits for
// $WANT1 on the page, marks the window, then writes $V2 to $FILE through
// the file API at $SHEEPFOLD_URL (sandbox $ID, key $SHEEPFOLD_API_KEY)
// and waits for $WANT2. Prints one JSON line: whether each text was seen,
// whether the mark survived (no reload), how many times the main frame
// navigated after the first load, and how long each step took.
import { chromium } from 'playwright-core'

const env = process.env
const browser = await chromium.launch({ executablePath: env.CHROMIUM ?? '/usr/bin/chromium', args: ['--no-sandbox'] })
const out = {}
try {
  const page = await browser.newPage()
  let navigations = 0
  out.console = []
  page.on('console', (m) => { if (m.type() === 'error' || m.type() === 'warning') out.console.push(m.text().slice(0, 300)) })
  page.on('pageerror', (e) => out.console.push(String(e).slice(0, 300)))
  page.on('framenavigated', (f) => { if (f === page.mainFrame()) navigations++ })
  const seen = (text) => page.waitForFunction((t) => document.body && document.body.innerText.includes(t), text, { timeout: 60000 })
  let t0 = Date.now()
  await page.goto(env.PAGE)
  await seen(env.WANT1)
  out.first_ms = Date.now() - t0
  out.saw1 = true
  const loads = navigations
  await page.evaluate(() => { window.__mark = 'kept' })
  t0 = Date.now()
  const res = await fetch(`${env.SHEEPFOLD_URL}/v1/sandboxes/${env.ID}/files?path=${encodeURIComponent(env.FILE)}`, {
    method: 'PUT', headers: { Authorization: `Bearer ${env.SHEEPFOLD_API_KEY}` }, body: env.V2,
  })
  out.write_status = res.status
  await seen(env.WANT2)
  out.hmr_ms = Date.now() - t0
  out.saw2 = true
  out.mark = await page.evaluate(() => window.__mark ?? null)
  out.reloads = navigations - loads
  out.url = page.url()
} catch (e) {
  out.error = String(e)
  out.body = await browser.contexts()[0]?.pages()[0]?.evaluate(() => document.documentElement.outerHTML.slice(0, 1500)).catch(() => '')
} finally {
  await browser.close()
}
console.log(JSON.stringify(out))
