// A hostile preview against a logged-in dashboard viewer, in Debian's
// chromium driven by playwright-core (internal/server's
// TestPreviewBrowserIsolation runs it and judges the results).
//
// The viewer logs in to the dashboard at $SHEEPFOLD_URL with
// $SHEEPFOLD_API_KEY; the API's origin also holds a cookie scripts may
// read (api_readable). Then, for each run of $RUNS (a JSON array of
// [name, URL of the page], in order), the dashboard opens the page with
// window.open, keeping window.opener (worse than the dashboard's own
// links, which have noopener), and the page's script tries what a tenant
// would: read document.cookie, fetch /v1/sandboxes and /v1/account with
// the viewer's credentials, set cookies for the API's origin, read the
// dashboard through window.opener, a window it opens and an iframe. The
// page leaves what it obtained in window.__results; this prints one JSON
// line: run → those results, the page's final URL and the names of the
// cookies the API's origin holds after it.
import { chromium } from 'playwright-core'

const url = process.env.SHEEPFOLD_URL
const key = process.env.SHEEPFOLD_API_KEY
const runs = JSON.parse(process.env.RUNS)

const browser = await chromium.launch({ executablePath: process.env.CHROMIUM ?? '/usr/bin/chromium', args: ['--no-sandbox'] })
const out = {}
try {
  const ctx = await browser.newContext()
  await ctx.addCookies([{ name: 'api_readable', value: 'secret-api-cookie', url }])
  const page = await ctx.newPage()
  await page.goto(`${url}/ui/`)
  await page.fill('#key', key)
  await page.click('#login')
  await page.waitForSelector('#sandboxes, #no-sandboxes')
  for (const [name, target] of runs) {
    const [hostile] = await Promise.all([ctx.waitForEvent('page'), page.evaluate((u) => { window.open(u) }, target)])
    await hostile.waitForFunction(() => window.__results !== undefined, null, { timeout: 60000 })
    out[name] = await hostile.evaluate(() => window.__results)
    out[name].final = hostile.url()
    out[name].apiCookies = (await ctx.cookies(url)).map((c) => c.name)
    for (const p of ctx.pages()) {
      if (p !== page) await p.close()
    }
  }
} finally {
  await browser.close()
}
console.log(JSON.stringify(out))
