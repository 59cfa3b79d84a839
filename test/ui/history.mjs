// A sandbox's execution history in a real browser (Debian's chromium,
// driven by playwright-core), as a user reads what the seeds produce: the
// Black-Friday cell's chart and its DataFrame as a table whose cells are
// visible (checked on a screenshot of the table, not only in the DOM), an
// error's traceback, and streamed text as a terminal shows it (colour
// codes gone, a line rewritten with \r shown once, as it ended). Run by
// test/integration's TestDashboardHistory; screenshots go to $ARTIFACTS.
import { chromium } from 'playwright-core'
import assert from 'node:assert/strict'
import { mkdirSync } from 'node:fs'

const url = process.env.SHEEPFOLD_URL
const key = process.env.SHEEPFOLD_API_KEY
const sandbox = process.env.HISTORY_SANDBOX
const out = process.env.ARTIFACTS
mkdirSync(out, { recursive: true })

const browser = await chromium.launch({ executablePath: process.env.CHROMIUM ?? '/usr/bin/chromium', args: ['--no-sandbox'] })
const page = await browser.newPage({ viewport: { width: 1280, height: 900 } })
const errors = []
page.on('pageerror', (e) => errors.push(e.message))

// inkOf counts the dark pixels of a PNG screenshot, decoded by the page's
// own canvas: text drawn in it is dark on a light background.
const inkOf = (png) => page.evaluate(async (b64) => {
  const img = new Image()
  img.src = `data:image/png;base64,${b64}`
  await img.decode()
  const c = document.createElement('canvas')
  c.width = img.width
  c.height = img.height
  const g = c.getContext('2d')
  g.drawImage(img, 0, 0)
  const d = g.getImageData(0, 0, c.width, c.height).data
  let dark = 0
  for (let i = 0; i < d.length; i += 4) if (d[i] + d[i + 1] + d[i + 2] < 3 * 110) dark++
  return dark
}, png.toString('base64'))

try {
  await page.goto(`${url}/ui/`)
  await page.fill('#key', key)
  await page.click('#login')
  await page.waitForSelector('#sandboxes, #no-sandboxes')
  await page.goto(`${url}/ui/#/sandbox/${sandbox}`)

  // The Black-Friday cell: its chart, then its DataFrame as a table.
  const cell = page.locator('#executions .execution', { hasText: 'black-friday-totals' })
  await cell.waitFor({ timeout: 60000 })
  const chart = cell.locator('img.result')
  await chart.waitFor()
  assert.ok(await chart.evaluate((i) => i.complete && i.naturalWidth > 100), 'the chart is not drawn')
  const table = cell.locator('table.frame')
  await table.waitFor({ timeout: 10000 })
  await table.scrollIntoViewIfNeeded()
  for (const text of ['country', 'total', 'DE', 'FR', '25.5', '20.0']) {
    const c = table.locator('th, td', { hasText: new RegExp(`^${text.replace('.', '\\.')}$`) }).first()
    assert.ok(await c.isVisible(), `the cell ${text} is not visible`)
  }
  const shot = await table.screenshot({ path: `${out}/history-dataframe.png` })
  const ink = await inkOf(shot)
  assert.ok(ink > 200, `the table's screenshot is blank (${ink} dark pixels)`)
  console.log(`dataframe table: ${ink} dark pixels`)
  await cell.screenshot({ path: `${out}/history-black-friday.png` })

  // Other HTML: in a sandboxed frame, drawn.
  const card = page.locator('#executions .execution', { hasText: 'history-html' })
  const frame = card.locator('iframe.result')
  await frame.waitFor()
  await frame.contentFrame().locator('b', { hasText: 'html-result-ok' }).waitFor({ timeout: 10000 })
  const frameInk = await inkOf(await frame.screenshot({ path: `${out}/history-html.png` }))
  assert.ok(frameInk > 50, `the HTML frame's screenshot is blank (${frameInk} dark pixels)`)

  // An error: its traceback, as the user's code raised it.
  const failed = page.locator('#executions .execution', { hasText: 'history-error' })
  await failed.waitFor()
  const tb = await failed.locator('pre.stderr').last().innerText()
  assert.match(tb, /ZeroDivisionError/)
  assert.doesNotMatch(tb, /\x1b\[/, 'colour codes in the traceback')

  // Streamed text: progress rewritten with \r shows as it ended, colours
  // are not shown as escape codes.
  const streamed = page.locator('#executions .execution', { hasText: 'history-stream' })
  const text = await streamed.locator('pre.stdout').innerText()
  assert.match(text, /progress 100%/)
  assert.doesNotMatch(text, /progress 10%/, 'a line rewritten with \\r is shown with its old text')
  assert.doesNotMatch(text, /\x1b|\[31m/, 'colour codes shown as text')
  assert.match(text, /red alert/)
  await streamed.screenshot({ path: `${out}/history-stream.png` })
  await page.screenshot({ path: `${out}/history-page.png`, fullPage: true })
  assert.deepEqual(errors, [], 'errors in the page')
} catch (e) {
  await page.screenshot({ path: `${out}/history-failed.png`, fullPage: true }).catch(() => {})
  throw e
} finally {
  await browser.close()
}
