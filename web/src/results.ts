import { html } from 'htm/preact'

// The most rows and columns a table result shows (the rest is counted).
const maxRows = 200
const maxCols = 50

// frameTables reads the tables of an HTML result (a pandas DataFrame's
// _repr_html_) as rows of cell texts. The HTML is parsed inert (DOMParser
// runs no script and loads nothing) and only text is taken from it, so
// the table is drawn by the page itself, readable and selectable, rather
// than in a frame. null when the result holds no table.
function frameTables(src: string): { head: string[][], body: { th: boolean, text: string }[][], more: number }[] | null {
  if (!/<table[\s>]/i.test(src)) return null
  const doc = new DOMParser().parseFromString(src, 'text/html')
  const tables = [...doc.querySelectorAll('table')]
  if (tables.length === 0) return null
  return tables.map((t) => {
    const cells = (tr: Element) => [...tr.children].filter((c) => c.tagName === 'TH' || c.tagName === 'TD').slice(0, maxCols)
    const head = [...t.querySelectorAll(':scope > thead > tr')].map((tr) => cells(tr).map((c) => c.textContent ?? ''))
    const rows = [...t.querySelectorAll(':scope > tbody > tr, :scope > tr')]
    const body = rows.slice(0, maxRows).map((tr) => cells(tr).map((c) => ({ th: c.tagName === 'TH', text: c.textContent ?? '' })))
    return { head, body, more: Math.max(0, rows.length - maxRows) }
  })
}

// Table draws a DataFrame (or any HTML table result) as a table.
function Table({ src }: { src: string }) {
  const tables = frameTables(src)
  if (!tables) return null
  return html`${tables.map((t) => html`<div class="frame-wrap"><table class="frame">
    ${t.head.length > 0 && html`<thead>${t.head.map((r) => html`<tr>${r.map((c) => html`<th>${c}</th>`)}</tr>`)}</thead>`}
    <tbody>${t.body.map((r) => html`<tr>${r.map((c) => c.th ? html`<th>${c.text}</th>` : html`<td>${c.text}</td>`)}</tr>`)}</tbody>
  </table>${t.more > 0 && html`<p class="muted">${t.more} more rows</p>`}</div>`)}`
}

// terminalText is output as a terminal shows it: colour and cursor
// escape codes removed, and a line rewritten with \r (a progress bar)
// shown as it ended.
export function terminalText(s: string): string {
  // eslint-disable-next-line no-control-regex
  s = s.replace(/\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(\x07|\x1b\\)|\x1b[@-Z\\-_]/g, '')
  return s.split('\n').map((line) => {
    const parts = line.split('\r')
    // "text\r" then nothing: the line as it was before the \r.
    while (parts.length > 1 && parts[parts.length - 1] === '') parts.pop()
    return parts[parts.length - 1]
  }).join('\n')
}

// Result renders one rich result. What a sandbox produces is untrusted:
// images are data URLs, tables are drawn from the text of their cells,
// other HTML goes in a sandboxed frame that runs no script (and has an
// origin of its own), text is text.
export function Result({ r }: { r: any }) {
  if (r.png) return html`<img class="result" alt="PNG result" src=${`data:image/png;base64,${r.png}`} />`
  if (r.jpeg) return html`<img class="result" alt="JPEG result" src=${`data:image/jpeg;base64,${r.jpeg}`} />`
  if (r.svg) return html`<img class="result" alt="SVG result" src=${`data:image/svg+xml;base64,${btoa(unescape(encodeURIComponent(r.svg)))}`} />`
  if (r.html && frameTables(r.html)) return html`<${Table} src=${r.html} />`
  if (r.html) return html`<iframe class="result" sandbox="" referrerpolicy="no-referrer" srcdoc=${r.html}></iframe>`
  if (r.json !== undefined) return html`<pre class="result">${JSON.stringify(r.json, null, 2)}</pre>`
  return html`<pre class="result">${terminalText(r.text ?? r.markdown ?? '')}</pre>`
}

export function Execution({ x }: { x: any }) {
  return html`<div class="execution" data-id=${x.id}>
    <pre class="code">${x.code}</pre>
    <div class="muted">${x.created_at ? `${new Date(x.created_at).toLocaleTimeString()} · ` : ''}${x.language ? `${x.language} · ` : ''}${x.status}${x.execution_time_ms !== undefined ? ` · ${x.execution_time_ms.toFixed(1)} ms` : ''}${x.error_code ? ` · ${x.error_code}` : ''}${x.cut ? ' · cut to the history\'s bounds' : ''}${x.unkept ? ' · output no longer kept' : ''}</div>
    ${x.stdout && html`<pre class="stdout">${terminalText(x.stdout)}</pre>`}
    ${x.stderr && html`<pre class="stderr">${terminalText(x.stderr)}</pre>`}
    ${(x.results ?? []).map((r: any) => html`<${Result} r=${r} />`)}
    ${x.error && html`<pre class="stderr">${terminalText(x.error.traceback || `${x.error.name}: ${x.error.value}`)}</pre>`}
  </div>`
}
