import { html } from 'htm/preact'
import { useEffect, useRef, useState } from 'preact/hooks'
import { api } from './api'
import { age, bytes } from './format'

interface Row { id: string; template: string; state: string; created_at: string; cpu?: number; memory?: number }

// Sandboxes is the live list: polled every 2 s, CPU load from the change
// in CPU time between polls.
export function Sandboxes() {
  const [rows, setRows] = useState<Row[] | null>(null)
  const [err, setErr] = useState('')
  const [busy, setBusy] = useState(false)
  const last = useRef(new Map<string, { cpu: number; at: number }>())
  useEffect(() => {
    let stop = false, timer = 0
    const poll = async () => {
      try {
        const page = await api('GET', '/v1/sandboxes?usage=1')
        const now = performance.now(), prev = last.current, next = new Map()
        setRows(page.sandboxes.map((s: any): Row => {
          const row: Row = { id: s.id, template: s.template, state: s.state, created_at: s.created_at }
          if (s.usage) {
            const p = prev.get(s.id)
            if (p && now > p.at) row.cpu = Math.max(0, (s.usage.cpu_seconds - p.cpu) / ((now - p.at) / 1000))
            row.memory = s.usage.memory_bytes
            next.set(s.id, { cpu: s.usage.cpu_seconds, at: now })
          }
          return row
        }))
        last.current = next
        setErr('')
      } catch (x: any) { setErr(x.message) }
      if (!stop) timer = setTimeout(poll, 2000)
    }
    poll()
    return () => { stop = true; clearTimeout(timer) }
  }, [])
  const create = async () => {
    setBusy(true)
    try {
      const sb = await api('POST', '/v1/sandboxes', { timeout: 3600 })
      location.hash = `#/sandbox/${sb.id}`
    } catch (x: any) { setErr(x.message) } finally { setBusy(false) }
  }
  return html`<section>
    <div class="bar"><h2>Sandboxes</h2><button id="create" disabled=${busy} onClick=${create}>New sandbox</button></div>
    ${err && html`<p class="error">${err}</p>`}
    ${rows === null ? html`<p class="muted">Loading…</p>` : rows.length === 0 ? html`<p id="no-sandboxes" class="muted">No running sandboxes.</p>` :
      html`<table id="sandboxes"><thead><tr><th>ID</th><th>Template</th><th>State</th><th>Age</th><th>CPU</th><th>Memory</th></tr></thead>
      <tbody>${rows.map(r => html`<tr key=${r.id}>
        <td><a href=${`#/sandbox/${r.id}`}>${r.id}</a></td><td>${r.template}</td><td>${r.state}</td><td>${age(r.created_at)}</td>
        <td>${r.cpu === undefined ? '–' : `${(r.cpu * 100).toFixed(0)} %`}</td><td>${r.memory === undefined ? '–' : bytes(r.memory)}</td>
      </tr>`)}</tbody></table>`}
  </section>`
}
