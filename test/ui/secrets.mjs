// The dashboard's secrets view in Debian's chromium driven by
// playwright-core (internal/server's TestDashboardSecrets runs it and
// judges the results): log in to $SHEEPFOLD_URL with $SHEEPFOLD_API_KEY,
// open the secrets list, read its rows, open $SECRET's uses and read
// theirs, and look for $VALUE (a secret's value) in every page and every
// answer the page received. Prints one JSON line: {list, info, uses,
// valueSeen, answers}; a screenshot of each view goes to $ARTIFACTS when set.
import { chromium } from 'playwright-core'
import { mkdirSync } from 'node:fs'

const url = process.env.SHEEPFOLD_URL
const key = process.env.SHEEPFOLD_API_KEY
const secret = process.env.SECRET
const value = process.env.VALUE
const artifacts = process.env.ARTIFACTS
if (artifacts) mkdirSync(artifacts, { recursive: true })

const rows = (page, sel) =>
  page.$$eval(`${sel} tbody tr`, (trs) => trs.map((tr) => [...tr.querySelectorAll('td')].map((td) => td.textContent.trim())))

const browser = await chromium.launch({ executablePath: process.env.CHROMIUM ?? '/usr/bin/chromium', args: ['--no-sandbox'] })
const out = { valueSeen: false }
try {
  const page = await browser.newPage({ viewport: { width: 1280, height: 900 } })
  const bodies = []
  page.on('response', (r) => {
    bodies.push(r.text().then((b) => { if (b.includes(value)) out.valueSeen = true }, () => { /* a body not kept (redirects) */ }))
  })
  await page.goto(`${url}/ui/`)
  await page.fill('#key', key)
  await page.click('#login')
  await page.waitForSelector('#sandboxes, #no-sandboxes')
  await page.click('nav a[href="#/secrets"]')
  await page.waitForSelector('#secrets')
  out.list = await rows(page, '#secrets')
  if ((await page.content()).includes(value)) out.valueSeen = true
  if (artifacts) await page.screenshot({ path: `${artifacts}/secrets.png`, fullPage: true })
  await page.click(`#secrets a[href="#/secrets/${encodeURIComponent(secret)}"]`)
  await page.waitForSelector('#secret-uses')
  await page.waitForSelector('#secret-info')
  out.info = await page.textContent('#secret-info')
  out.uses = await rows(page, '#secret-uses')
  if ((await page.content()).includes(value)) out.valueSeen = true
  if (artifacts) await page.screenshot({ path: `${artifacts}/secret-uses.png`, fullPage: true })
  await Promise.all(bodies)
  out.answers = bodies.length
} finally {
  await browser.close()
}
console.log(JSON.stringify(out))
